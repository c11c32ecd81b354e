"""Cost of ``tracekit.generation()`` against the decode step it instruments, in one run.

The baseline is a small randomly initialised decoder-only transformer on the CPU (two
pre-norm blocks, d=128, 4 heads, a KV cache, batch 1, greedy): one decode step feeds one
token through it. What a request pays is the CPU time of the thread that serves it (one
torch thread, so the model runs on it too), so that is what is timed, in one process,
interleaved over several rounds (medians):

- the decode step;
- ``g.token()`` per call inside an open, recording generation (an empty loop's cost
  taken off);
- a whole request's instrumentation: ``generation()`` with ``admitted()``,
  ``first_token()`` and a token per step, under an SDK SERVER span as
  ``instrument_fastapi`` makes it, against the same request loop without it — on the
  request's thread, and for the process (with the background building of its spans);
- as a check, whole model requests with and without ``generation()``.

Spans go through the real pipeline into an exporter that discards.

    .venv/bin/python benchmarks/generation.py [--tokens 64] [--prompt 32] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from torch import nn
from torch.nn import functional as F

import tracekit
from tracekit.instrumentation import setup

D, HEADS, LAYERS, FFN, VOCAB = 128, 4, 2, 512, 512
Cache = list[tuple[torch.Tensor, torch.Tensor]]


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


# --- the model ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ff1, self.ff2 = nn.Linear(D, FFN), nn.Linear(FFN, D)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        t = x.shape[1]
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (z.view(1, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        # the prompt attends causally; one new token attends to everything cached
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        x = x + self.proj(a.transpose(1, 2).reshape(1, t, D))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)))), (k, v)


class TinyDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(4096, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, cache: Cache | None) -> tuple[torch.Tensor, Cache]:
        start = 0 if cache is None else cache[0][0].shape[2]
        x = self.embed(ids) + self.pos(torch.arange(start, start + ids.shape[1]))
        new: Cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new.append(kv)
        return self.head(self.ln(x[:, -1])), new


def prefill(model: TinyDecoder, prompt: torch.Tensor) -> tuple[torch.Tensor, Cache]:
    logits, cache = model(prompt, None)
    return logits.argmax(-1, keepdim=True), cache


def step(model: TinyDecoder, tok: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
    logits, cache = model(tok, cache)
    return logits.argmax(-1, keepdim=True), cache


# --- what is timed ---------------------------------------------------------------------------


_cpu = time.thread_time_ns


def decode_step_us(model: TinyDecoder, prompt: torch.Tensor, steps: int) -> float:
    tok, cache = prefill(model, prompt)
    t0 = _cpu()
    for _ in range(steps):
        tok, cache = step(model, tok, cache)
    return (_cpu() - t0) / steps / 1000


def token_call_us(n: int) -> float:
    """One ``g.token()`` in an open, recording generation (the loop's own cost removed)."""
    rng = range(n)
    with tracekit.generation() as g:
        g.first_token()
        token = g.token
        t0 = _cpu()
        for _ in rng:
            token()
        t1 = _cpu()
        for _ in rng:
            pass
        t2 = _cpu()
    return ((t1 - t0) - (t2 - t1)) / n / 1000


def request_variants(tokens: int) -> dict[str, Callable[[], None]]:
    """One request's loop, instrumentation only (no model): without and with generation()."""
    server = setup.tracer("bench.server")  # an SDK span, as instrument_fastapi's
    rest = range(tokens - 1)

    def plain() -> None:
        with server.start_as_current_span("POST /generate", kind=SpanKind.SERVER):
            for _ in rest:
                pass

    def traced() -> None:
        with (
            server.start_as_current_span("POST /generate", kind=SpanKind.SERVER),
            tracekit.generation(prompt_tokens=32, max_tokens=tokens, model="tiny") as g,
        ):
            g.admitted()
            g.first_token()
            for _ in rest:
                g.token()

    return {"request, no generation()": plain, "request, generation()": traced}


def timed(fn: Callable[[], None], n: int) -> tuple[float, float]:
    """(thread CPU us, process CPU us incl. background span building) per call, ``n`` calls."""
    t0, p0 = _cpu(), time.process_time_ns()
    for _ in range(n):
        fn()
    thread = _cpu() - t0
    setup.flush()
    return thread / n / 1000, (time.process_time_ns() - p0) / n / 1000


def model_request(model: TinyDecoder, prompt: torch.Tensor, tokens: int, traced: bool) -> float:
    """Thread CPU us of one whole model request of ``tokens`` output tokens."""
    t0 = _cpu()
    if traced:
        with tracekit.generation(prompt_tokens=prompt.shape[1], max_tokens=tokens) as g:
            g.admitted()
            tok, cache = prefill(model, prompt)
            g.first_token()
            for _ in range(tokens - 1):
                tok, cache = step(model, tok, cache)
                g.token()
    else:
        tok, cache = prefill(model, prompt)
        for _ in range(tokens - 1):
            tok, cache = step(model, tok, cache)
    return (_cpu() - t0) / 1000


def run(tokens: int, prompt_len: int, rounds: int, token_calls: int, requests: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyDecoder().eval()
    prompt = torch.randint(0, VOCAB, (1, prompt_len))
    tracekit.configure(service_name="bench-generation", exporter=Discard())
    variants = request_variants(tokens)
    got: dict[str, list[float]] = {
        k: []
        for k in ("step", "token", "model plain", "model traced", *variants, *(f"{v} cpu" for v in variants))
    }  # fmt: skip
    with torch.inference_mode():
        for rnd in range(rounds + 1):  # round 0 warms up
            sample: dict[str, float] = {
                "step": decode_step_us(model, prompt, tokens),
                "token": token_call_us(token_calls),
            }
            plain_runs, traced_runs = [], []
            for _ in range(5):  # alternated, so that drift hits both alike
                plain_runs.append(model_request(model, prompt, tokens, False))
                traced_runs.append(model_request(model, prompt, tokens, True))
            sample["model plain"] = statistics.median(plain_runs)
            sample["model traced"] = statistics.median(traced_runs)
            for name, fn in variants.items():
                sample[name], sample[f"{name} cpu"] = timed(fn, requests)
            if rnd:
                for k, v in sample.items():
                    got[k].append(v)
    tracekit.shutdown()
    med = {k: statistics.median(v) for k, v in got.items()}

    step_us, token_us = med["step"], med["token"]
    plain, traced = variants
    per_request = med[traced] - med[plain]
    per_request_cpu = med[f"{traced} cpu"] - med[f"{plain} cpu"]
    model_us = med["model plain"]
    print(
        f"model: decoder-only, {LAYERS} layers, d={D}, {HEADS} heads, KV cache, batch 1, "
        f"CPU, 1 thread, torch {torch.__version__}; prompt {prompt_len}, {tokens} output tokens"
    )
    print(f"median of {rounds} rounds, CPU time of the request's thread")
    print(f"{'what':<44}{'us':>12}")
    for label, value in (
        ("decode step (one token through the model)", step_us),
        ("g.token() per call", token_us),
        ("request loop, no generation()", med[plain]),
        ("request loop, generation()", med[traced]),
        ("model request, no generation()", model_us),
        ("model request, generation()", med["model traced"]),
    ):
        print(f"{label:<44}{value:>12.3f}")
    print(f"overhead per token: {token_us:.3f} µs = {token_us / step_us:.4%} of a decode step")
    print(
        f"overhead per request ({tokens} tokens, generation() under a SERVER span): "
        f"{per_request:.2f} µs on the request's thread = {per_request / model_us:.3%} of the "
        f"request's model time; process CPU incl. building its spans {per_request_cpu:.2f} µs"
    )
    rounds_plain = got["model plain"]
    spread = (max(rounds_plain) - min(rounds_plain)) / model_us
    print(
        f"check, whole model requests traced / untraced: {med['model traced'] / model_us:.4f} "
        f"(the untraced request's own spread over rounds: {spread:.1%})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--token-calls", type=int, default=200_000, help="g.token() calls per round")
    ap.add_argument(
        "--requests", type=int, default=2000, help="request loops per variant per round"
    )
    args = ap.parse_args(argv)
    run(args.tokens, args.prompt, args.rounds, args.token_calls, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
