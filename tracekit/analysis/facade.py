"""The front door: one object opened on a store, every question tracekit answers.

::

    from tracekit import Analysis

    with Analysis.open("tracekit.duckdb") as analysis:
        print(analysis.diff("v1", "v2").verdict.summary)

:class:`Analysis` owns the store strategy — a DuckDB file read in place, or the
selected requests of a ClickHouse table (``clickhouse://…``, ``chdb:///…``) pulled and
attributed once at open — and decides, once, whether two labels are training runs or
releases. Each method returns the typed result the renderers take
(:func:`tracekit.render.render`); the commands are parse → one call here → render, and
the demo calls the same methods. Holistic Trace Analysis' ``TraceAnalysis`` is the
model: open once, then ask.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from tracekit import units
from tracekit.analysis import report as reports
from tracekit.analysis.attribute import AttributeReport, Shard, attribute, follow, parse_shard
from tracekit.analysis.attribution import per_request
from tracekit.analysis.attribution.explain import Explanation, explain_trace
from tracekit.analysis.autoscale import rules as scaling
from tracekit.analysis.autoscale.audit import AutoscaleResult, audit_autoscaling
from tracekit.analysis.autoscale.model import Slo, parse_slo
from tracekit.analysis.autoscale.rule_files import load_rule
from tracekit.analysis.capacity.model import CapacityResult
from tracekit.analysis.cohorts.tokens import E2E, parse_metric
from tracekit.analysis.compare.diff import DiffResult, diff_releases
from tracekit.analysis.compare.summary import (
    SlowFast,
    Summary,
    slow_vs_fast,
    summarize_all,
    summarize_release,
)
from tracekit.analysis.gate.budgets import Budget, GateConfig, load_config, parse_budgets
from tracekit.analysis.gate.evaluate import DEFAULT_CONFIDENCE, GateResult, run_gate
from tracekit.analysis.ingest import genai
from tracekit.analysis.ingest.kineto_profiles import Armed, arm_capture
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.loading import JAEGER_LIMIT, IngestOutcome, ingest
from tracekit.analysis.report import Report
from tracekit.analysis.store import DatabaseError, Store, open_store
from tracekit.analysis.store.attributed import AttributedNames
from tracekit.analysis.store.url import DEFAULT_TABLE, StoreURL, parse_store_url
from tracekit.analysis.training.diff import diff_runs
from tracekit.analysis.training.gate import METRICS as TRAINING_METRICS
from tracekit.analysis.training.gate import TrainingGateResult, gate_runs
from tracekit.analysis.training.model import StepsResult, TrainingDiff
from tracekit.analysis.training.steps import steps_report, training_runs
from tracekit.errors import ConfigError

__all__ = [
    "JAEGER_LIMIT",
    "Analysis",
    "Armed",
    "AttributeReport",
    "AttributedNames",
    "CapacityResult",
    "ConfigError",
    "Shard",
    "attribute",
    "follow",
    "parse_shard",
    "parse_store_url",
    "DatabaseError",
    "DiffResult",
    "GateResult",
    "IngestOutcome",
    "Report",
    "Slo",
    "TrainingDiff",
    "TrainingGateResult",
    "arm_profile",
    "ingest",
    "local_store_path",
    "parse_slo",
]

When = str | int | dt.datetime
"""A point in time: ``"2h"`` back from now, an ISO time, a datetime, or Unix ns."""


def local_store_path(store: str | Path, *, table: str = DEFAULT_TABLE) -> str | None:
    """The file or directory ``store`` reads on this machine (None for a server or
    ``:memory:``): what no output may overwrite."""
    url = parse_store_url(str(store), table=table)
    local = url.kind in ("duckdb", "chdb") and url.path and url.path != ":memory:"
    return url.path if local else None


def arm_profile(pid: int, steps: int | None = None) -> Armed:
    """Ask the running service ``pid`` (this user's) for one on-demand profile capture
    (SIGUSR2; docs/kineto.md, "Profiles captured on trigger"). ``steps`` is advisory:
    the service captures its configured number of executions. A missing, foreign or
    unprepared process is a :class:`ConfigError`."""
    return arm_capture(pid, steps)


@dataclass(frozen=True)
class _GateSettings:
    """A gate's options once arguments, the config file and the defaults are merged."""

    budgets: tuple[Budget, ...]
    training_budgets: list[str] | None
    """The budgets as given, for the training gate (which parses its own)."""
    training_only: bool
    """Every budget given is a training budget (samples/s, step time, efficiency)."""
    confidence: float
    min_effect_ms: float
    service: str | None
    route: str | None
    metric: str = "e2e"
    """The latency the budgets are on (``e2e``, ``ttft``, ``tpot``)."""

    def check_budgets(self, *, training: bool) -> None:
        """Training budgets on two releases would be silently replaced by the defaults:
        say so instead."""
        if self.training_only and not training:
            assert self.training_budgets
            raise ConfigError(
                f"budget {self.training_budgets[0]!r} is for training runs (train_step "
                "traces); compare two of them, or give a latency budget such as 'p99<=+10%'"
            )


def _serving_only(metric: str) -> None:
    """``--metric ttft|tpot`` are request latencies: two training runs have none."""
    if metric != E2E:
        raise ConfigError(
            f"--metric {metric} is a latency of LLM requests; two training runs compare steps"
            " (drop --metric)"
        )


def _is_training_budget(text: str) -> bool:
    return text.strip().startswith(TRAINING_METRICS)


class Analysis:
    """Every analysis of one store (or one selection of a ClickHouse table).

    Open it with :meth:`open` and close it (or use ``with``). Methods never print; each
    returns a result dataclass. Errors in what was asked (an unknown release, a bad
    budget) are :class:`~tracekit.errors.TracekitError` with a one-line message.
    """

    def __init__(
        self,
        store: Store | Callable[[], Store],
        url: StoreURL,
        *,
        pull_spans: Callable[[str | None], Store] | None = None,
    ) -> None:
        """``store``, or what opens it when first needed (a ClickHouse pull: a method
        checks its arguments first, so a typo costs no pull). ``pull_spans`` gives the
        selection's spans (or one trace's) where ``store`` holds attributed requests only:
        training runs and waterfalls are drawn from spans."""
        self._opened: Store | None = None if callable(store) else store
        self._open = store if callable(store) else None
        self._pull_spans = pull_spans
        self._spans: Store | None = None
        self._runs: dict[str, int] | None = None
        self.url = url

    @property
    def _attributed(self) -> bool:
        return bool(getattr(self._store, "attributed", False))

    @property
    def _span_store(self) -> Store:
        """A store with spans: the store itself, or (attributed) the selection's spans."""
        if not self._attributed:
            return self._store
        if self._spans is None:
            assert self._pull_spans is not None
            self._spans = self._pull_spans(None)
        return self._spans

    @property
    def _store(self) -> Store:
        if self._opened is None:
            assert self._open is not None
            self._opened = self._open()
        return self._opened

    @classmethod
    def open(
        cls,
        store: str | Path = "tracekit.duckdb",
        *,
        table: str = DEFAULT_TABLE,
        since: When | None = None,
        until: When | None = None,
        releases: str | Sequence[str] = (),
        service: str | None = None,
        route: str | None = None,
        trace_prefix: str | None = None,
    ) -> Analysis:
        """Open ``store`` read-only: a DuckDB file, ``clickhouse://user:pw@host:8123/db``
        or ``chdb:///path``.

        For a ClickHouse store only the selected requests are pulled (``releases``,
        ``service``, ``route``, a ``trace_prefix``, starting in ``[since, until)``) and
        attributed, once, when the first question needs them; every method then reads
        them. A DuckDB file holds what was ingested into it, so a time range there is an
        error.
        """
        url = parse_store_url(str(store), table=table)
        if not url.is_clickhouse:
            if since is not None or until is not None:
                raise ConfigError(
                    "--since/--until select from a ClickHouse store; a DuckDB store holds "
                    "what was ingested into it"
                )
            return cls(open_store(url.path, read_only=True), url)
        from tracekit.analysis.store.attributed import open_attributed
        from tracekit.analysis.store.clickhouse import (
            ClickHouseSnapshot,
            Selection,
            open_snapshot,
        )

        labels = [releases] if isinstance(releases, str) else list(releases or ())
        selection = Selection(
            # "" is a label too: the requests without service.version.
            releases=tuple(str(r) for r in labels if r is not None),
            service=service,
            route=route,
            trace_prefix=trace_prefix,
            since_ns=None if since is None else units.parse_time_ns(since),
            until_ns=None if until is None else units.parse_time_ns(until),
        )

        def pull_spans(prefix: str | None = None) -> ClickHouseSnapshot:
            """The selected traces' spans, attributed here (``prefix``: one trace)."""
            chosen = selection if prefix is None else replace(selection, trace_prefix=prefix)
            snapshot = open_snapshot(url, chosen)
            try:
                # vLLM's latency attributes become stages here too, as at ingest (docs/llm.md).
                genai.derive(snapshot, ProblemLog(strict=False), staged=False)
                per_request.refresh(snapshot)
            except BaseException:
                snapshot.close()
                raise
            return snapshot

        def pull() -> Store:
            # Attributed once by `tracekit attribute`: read the requests' rows, no span.
            # explain needs the one trace's spans, and a database without the attributed
            # tables gets today's pull (and a note saying so).
            if trace_prefix is None:
                attributed = open_attributed(url, selection)
                if attributed is not None:
                    return attributed
            snapshot = pull_spans()
            if trace_prefix is None:
                snapshot.notes.append(
                    f"no attributed tables in {url.display()}: pulled and attributed "
                    f"{snapshot.pulled_rows:,} spans for this command; run `tracekit "
                    "attribute --store URL` once (and then as traffic arrives) to answer "
                    "from attributed requests"
                )
            return snapshot

        return cls(pull, url, pull_spans=pull_spans)

    # --- the store --------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The underlying store, for queries of your own (``store.con`` is DuckDB)."""
        return self._store

    @property
    def path(self) -> str:
        """Where the numbers come from: the DuckDB path or the ClickHouse URL shown."""
        return self.url.display()

    @property
    def notes(self) -> list[str]:
        """What the reader of any answer should know about where it came from: on a
        ClickHouse store, how far the attributed tables lag the spans, or that there
        were none and the spans were pulled."""
        return list(getattr(self._opened, "notes", ()))

    def close(self) -> None:
        for store in (self._opened, self._spans):
            if store is not None:
                store.close()

    def __enter__(self) -> Analysis:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def releases(self) -> list[str]:
        """Release labels (``service.version``) in the store, training runs included."""
        return [label for label, _ in self._store.releases()]

    def training_runs(self) -> list[str]:
        """Labels whose traces are training steps (``train_step`` spans)."""
        if self._runs is None:  # the store is read-only: asked once
            store = self._store
            attributed = getattr(store, "training_labels", None) if self._attributed else None
            self._runs = dict(attributed) if attributed is not None else training_runs(store)
        return list(self._runs)

    def is_training(self, before: str, after: str) -> bool:
        """Both labels are training runs: diff and gate compare steps, not requests."""
        runs = self.training_runs()
        return before in runs and after in runs

    # --- serving and training questions -----------------------------------------------

    def summary(
        self,
        version: str | None = None,
        *,
        service: str | None = None,
        route: str | None = None,
        metric: str | None = None,
    ) -> list[Summary]:
        """Requests, tail quantiles and per-stage split: of ``version``, or of every release;
        ``metric``: ``e2e`` (default), ``ttft`` or ``tpot`` (docs/llm.md)."""
        m = parse_metric(metric)
        if version is None:
            return summarize_all(self._store, service=service, route=route, metric=m)
        return [summarize_release(self._store, version, service=service, route=route, metric=m)]

    def diff(
        self,
        before: str,
        after: str,
        *,
        service: str | None = None,
        route: str | None = None,
        confidence: float = DEFAULT_CONFIDENCE,
        jaeger_url: str | None = None,
        seed: int = 0,
        link_gbps: float | str | None = None,
        metric: str | None = None,
    ) -> DiffResult | TrainingDiff:
        """What ``after`` changed against ``before``: the tail's growth by stage, wait or
        compute (releases; ``metric``: ``e2e`` (default), ``ttft`` or ``tpot``); the lost
        scaling efficiency by bottleneck (training runs; ``link_gbps``: the inter-node
        link's rate in Gb/s, for the bandwidth's share)."""
        link = None if link_gbps is None else units.parse_link_gbps(link_gbps)
        m = parse_metric(metric)
        if self.is_training(before, after):
            _serving_only(m)
            return diff_runs(self._span_store, before, after, link_gbps=link)
        return diff_releases(
            self._store,
            before,
            after,
            service=service,
            route=route,
            confidence=confidence,
            jaeger_url=jaeger_url,
            seed=seed,
            metric=m,
        )

    def slow(
        self,
        version: str | None = None,
        *,
        service: str | None = None,
        route: str | None = None,
        jaeger_url: str | None = None,
    ) -> SlowFast:
        """Slow (≥ p99) vs fast (≤ p50) requests of one release, stage by stage."""
        return slow_vs_fast(
            self._store, version, service=service, route=route, jaeger_url=jaeger_url
        )

    def explain(self, trace_id: str) -> Explanation:
        """One trace (its id or a unique 8+ digit prefix): waterfall, critical path, stages."""
        if not self._attributed:
            return explain_trace(self._store, trace_id)
        assert self._pull_spans is not None
        with self._pull_spans(trace_id.strip().lower()) as one:  # its spans alone
            return explain_trace(one, trace_id)

    def gate(
        self,
        before: str,
        after: str,
        *,
        budgets: str | Sequence[str] | None = None,
        config: str | Path | GateConfig | None = None,
        confidence: float | None = None,
        min_effect_ms: float | None = None,
        seed: int = 0,
        service: str | None = None,
        route: str | None = None,
        metric: str | None = None,
    ) -> GateResult | TrainingGateResult:
        """Pass, fail or inconclusive for ``after`` against budgets (docs/gate.md).

        Each option is taken from the argument, else from ``config`` (a
        ``tracekit-gate.toml`` path or a parsed :class:`GateConfig`), else the default
        (p95 and p99 within +10% at 95% confidence). On two training runs the budgets
        are on samples/s, step time or efficiency (docs/training.md).
        """
        s = self._gate_settings(budgets, config, confidence, min_effect_ms, service, route)
        s = dataclasses.replace(s, metric=parse_metric(metric))
        training = self.is_training(before, after)
        s.check_budgets(training=training)
        if training:
            _serving_only(s.metric)
            return gate_runs(
                self._span_store,
                before,
                after,
                s.training_budgets,
                confidence=s.confidence,
                seed=seed,
            )
        return self._run_gate(before, after, s, seed)

    def autoscale(
        self,
        versions: str | Sequence[str] | None = None,
        *,
        slo: str | Slo,
        rule: str | Path | scaling.ScalingRule | None = None,
        signal: str | None = None,
        target: str | None = None,
        min_replicas: int = 1,
        max_replicas: int = 100,
        window_s: float = 30.0,
        service: str | None = None,
    ) -> AutoscaleResult:
        """Would the scaling rule have fired when the objective broke, and which signal
        would have (docs/autoscale.md)?

        ``rule`` is an HPA, KEDA ScaledObject or Ray Serve file (or a parsed rule);
        ``signal`` and ``target`` say "scale on this instead"; neither: an HPA on CPU at
        70%. ``versions`` (default: the release traced last) form one time line.
        """
        if target is not None and signal is None:
            raise ConfigError("--target needs --signal (or give the rule with --hpa FILE)")
        if isinstance(rule, str | Path):
            chosen = load_rule(rule)
        elif rule is not None:
            chosen = rule
        elif signal is not None:
            if target is None:
                raise ConfigError("--signal needs --target (e.g. --signal inflight --target 5)")
            value = scaling.parse_target(signal, target)
            chosen = scaling.rule_from_flags(signal, value, min_replicas, max_replicas)
        else:
            chosen = scaling.default_rule()
        return audit_autoscaling(
            self._store,
            release=versions,
            rule=chosen,
            slo=parse_slo(slo) if isinstance(slo, str) else slo,
            window_s=window_s,
            service=service,
        )

    def steps(
        self, version: str | None = None, *, warmup: int = 1, link_gbps: float | str | None = None
    ) -> StepsResult:
        """Where training step time goes, per component and rank, with each collective's
        bus bandwidth (``link_gbps``: the inter-node link's rate in Gb/s; docs/training.md)."""
        if warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more, got {warmup}")
        link = None if link_gbps is None else units.parse_link_gbps(link_gbps)
        return steps_report(self._span_store, version, warmup=warmup, link_gbps=link)

    # --- reports (HTML pages are drawn from these by tracekit.render.html) -------------

    def report(
        self,
        before: str,
        after: str,
        *,
        gate: GateResult | None = None,
        budgets: str | Sequence[str] | None = None,
        config: str | Path | GateConfig | None = None,
        slo: str | Slo | None = None,
        window_s: float = 30.0,
        jaeger_url: str | None = None,
        service: str | None = None,
        route: str | None = None,
        confidence: float | None = None,
        seed: int = 0,
        metric: str | None = None,
    ) -> Report:
        """Everything the release report shows: diff, gate (``gate`` when already run,
        else run with ``budgets``/``config``), exemplar waterfalls and, given ``slo``,
        the autoscaling time line of both releases; two training runs: their diff."""
        s = self._gate_settings(budgets, config, confidence, None, service, route)
        s = dataclasses.replace(s, metric=parse_metric(metric))
        if self.is_training(before, after):
            _serving_only(s.metric)
            return reports.training_report(self._span_store, before, after)
        s.check_budgets(training=False)
        if gate is None:
            gate = self._run_gate(before, after, s, seed)
        return reports.release_report(
            self._store,
            before,
            after,
            gate,
            explain=self.explain,
            slo=parse_slo(slo) if isinstance(slo, str) else slo,
            window_s=window_s,
            jaeger_url=jaeger_url,
            service=s.service,
            route=s.route,
            confidence=gate.confidence,
            seed=seed,
            metric=s.metric,
        )

    def slow_report(
        self, result: SlowFast, *, service: str | None = None, route: str | None = None
    ) -> Report:
        """The page of ``tracekit slow --html``: the gap per stage, the curve, exemplars."""
        return reports.slow_report(
            self._store, result, service=service, route=route, explain=self.explain
        )

    def capacity(
        self,
        versions: str | Sequence[str],
        *,
        slo: str | Slo,
        window_s: float = 10.0,
        replica_cost: str | float | Sequence[str] | None = None,
        gpus_per_replica: int = 1,
        queue_budget_ms: float | None = None,
        service: str | None = None,
        route: str | None = None,
    ) -> CapacityResult:
        """Which binds first, latency under bursts or cost per request, and how to batch
        (docs/capacity.md). ``replica_cost``: a replica's price per hour (``2.50/h``), or
        prices per release (``["A=4.00/h", "B=1.20/h"]``, a bare price the default);
        ``queue_budget_ms``: the batch queue's share of the objective (default a fifth)."""
        from tracekit.analysis.capacity.analyse import capacity  # its own layer, loaded on use

        labels = [versions] if isinstance(versions, str) else list(versions)
        # the window, GPU count and cost are checked by the analysis itself
        if queue_budget_ms is not None and queue_budget_ms <= 0:
            raise ConfigError(f"--queue-budget must be positive, got {queue_budget_ms:g} ms")
        cost = units.parse_replica_costs(replica_cost, labels)
        result: CapacityResult = capacity(
            self._store,
            labels,
            parse_slo(slo) if isinstance(slo, str) else slo,
            span_store=self._span_store,
            window_s=window_s,
            replica_cost_per_h=cost,
            gpus_per_replica=gpus_per_replica,
            queue_budget_ms=queue_budget_ms,
            service=service,
            route=route,
        )
        return result

    def capacity_report(self, result: CapacityResult) -> Report:
        """The page of ``tracekit capacity --html``."""
        return reports.capacity_report(self._store, result)

    def autoscale_report(self, result: AutoscaleResult) -> Report:
        """The page of ``tracekit autoscale --html``: the time line and recommendation."""
        return reports.autoscale_report(self._store, result)

    def _run_gate(self, before: str, after: str, s: _GateSettings, seed: int) -> GateResult:
        return run_gate(
            self._store,
            before,
            after,
            budgets=s.budgets or None,
            confidence=s.confidence,
            min_effect_ms=s.min_effect_ms,
            seed=seed,
            service=s.service,
            route=s.route,
            metric=s.metric,
        )

    def _gate_settings(
        self,
        budgets: str | Sequence[str] | None,
        config: str | Path | GateConfig | None,
        confidence: float | None,
        min_effect_ms: float | None,
        service: str | None,
        route: str | None,
    ) -> _GateSettings:
        """Arguments beat the config file, which beats the defaults."""
        if isinstance(config, str | Path):
            # "" is no config: what `--config "${GATE_CONFIG:-}"` passes in CI.
            cfg = load_config(config) if str(config) else GateConfig()
        else:
            cfg = config or GateConfig()
        texts = [budgets] if isinstance(budgets, str) else list(budgets or ())
        # Training budgets (samples_per_s, step_ms…) are parsed by the training gate.
        training = bool(texts) and all(_is_training_budget(b) for b in texts)
        return _GateSettings(
            budgets=parse_budgets(texts) if texts and not training else cfg.budgets,
            training_only=training,
            training_budgets=texts or None,
            confidence=confidence or cfg.confidence or DEFAULT_CONFIDENCE,
            min_effect_ms=min_effect_ms if min_effect_ms is not None else cfg.min_effect_ms or 0.0,
            service=service or cfg.service,
            route=route or cfg.route,
        )
