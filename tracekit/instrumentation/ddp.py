"""``instrument_ddp()``: one ``communication`` span per DDP gradient bucket.

DDP allows one communication hook per model, so tracekit's hook wraps the hook that
would have run — the default all-reduce, or the user's own (``hook=``/``state=``) — and
records around it. The span is a child of the stage that was running when the bucket
was launched (``backward``), starts at the launch and carries ``tracekit.comm.async``:
the stage went on computing meanwhile, so the analysis counts as exposed only what is
left after the stage's last launch.

Timing: on gloo the future completes on gloo's thread when the collective is done, so
host time is right. On NCCL the future completes when the work is *enqueued*; host time
would lie, so CUDA events bracket the collective on the current stream and the span is
finished when the step ends (:func:`tracekit.instrumentation.training.settle_pending`), launch time + device time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation.training import (
    PENDING_DEVICE,
    PENDING_LOCK,
    group_info,
    group_name,
    launch_parent,
    start_comm_span,
)


class _Recorder:
    """The comm hook tracekit registers: the inner hook plus a span per bucket."""

    def __init__(self, inner: Callable[..., Any], inner_state: Any, group: Any) -> None:
        self.inner = inner
        self.inner_state = inner_state
        self.group = group_name(group)
        self.group_size, self.group_desc = group_info(group)
        self.backend = _backend(group)
        self.device = self.backend == "nccl"

    def __call__(self, _state: Any, bucket: Any) -> Any:
        span: trace.Span | None = None
        start_ev = None
        launch = time.time_ns()
        try:
            buf = bucket.buffer()
            span = start_comm_span(
                "all_reduce",
                nbytes=buf.numel() * buf.element_size(),
                group=self.group,
                parent=launch_parent(),
                start_ns=launch,
                is_async=True,
                backend=self.backend,
                group_size=self.group_size,
                group_desc=self.group_desc,
            )
            if self.device:
                import torch

                start_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start_ev.record()
        except Exception as exc:
            _guard.report("ddp: bucket start", exc)
        fut = self.inner(self.inner_state, bucket)
        if span is None:
            return fut
        return fut.then(self._done_callback(span, launch, start_ev))

    def _done_callback(self, span: trace.Span, launch: int, start_ev: Any) -> Callable[[Any], Any]:
        def done(f: Any) -> Any:
            try:
                if start_ev is not None:
                    import torch

                    end_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    end_ev.record()
                    with PENDING_LOCK:
                        PENDING_DEVICE.append((span, launch, start_ev, end_ev))
                else:
                    span.end()
            except Exception as exc:
                _guard.report("ddp: bucket end", exc)
            # the inner hook's result (the reduced bucket) is DDP's, unchanged; an error
            # in the collective itself is raised here, as without tracekit
            return f.value()

        return done


def _backend(group: Any) -> str | None:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(group)).lower()
    except Exception:  # uninitialised in a unit test, or a custom group
        return None


def instrument_ddp(ddp: Any, *, hook: Callable[..., Any] | None = None, state: Any = None) -> Any:
    """Record one ``communication`` span per gradient bucket of ``ddp``; returns ``ddp``.

    ``hook``/``state``: your own DDP communication hook (e.g. PowerSGD) — tracekit's runs
    it instead of the default all-reduce. DDP takes one hook per model, so register
    yours through here, not with ``ddp.register_comm_hook`` as well.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    registered = getattr(ddp, "_comm_hooks", None)
    if registered:
        raise ConfigError(
            "instrument_ddp(): this model already has a communication hook; pass it as "
            "instrument_ddp(ddp, hook=your_hook, state=your_state) instead of registering it"
        )
    group = getattr(ddp, "process_group", None)
    if hook is None:
        hook, state = default_hooks.allreduce_hook, group
    recorder = _Recorder(hook, state, group if group is not None else dist.group.WORLD)

    def tracekit_comm_hook(state: Any, bucket: Any) -> Any:
        return recorder(state, bucket)

    # DDP checks the annotations as objects: none, or exactly these
    tracekit_comm_hook.__annotations__ = {}

    ddp.register_comm_hook(state=None, hook=tracekit_comm_hook)
    return ddp
