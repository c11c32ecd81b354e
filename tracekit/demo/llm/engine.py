"""Continuous batching: one engine loop serves every request, a step at a time.

A request (:class:`Request`) waits in a FIFO queue until the KV cache has a free slot.
Each iteration of the engine's loop

1. admits waiting requests into free slots, oldest first;
2. runs one prefill per newly admitted request (its prompt into its slot; out comes its
   first token);
3. runs one batched decode step for every running request (each gets its next token);
4. retires the requests that have all their tokens (their slots are free for the next
   iteration's admissions) and drops those whose client went away.

So a request joins a running batch as soon as any slot frees — it does not wait for the
batch to drain, as static batching would make it — and every running request gains a
token per iteration. Tokens go to each request's own queue as they come;
:meth:`Engine.stream` yields them. Requests generate exactly ``max_tokens`` tokens (no
end-of-sequence token), so a stream's length is known up front.

The model runs on one worker thread (:class:`~tracekit.demo.llm.model.Runner` is not
thread-safe; the event loop stays free to stream tokens meanwhile); everything else —
the queue, slots, and the phase marks — runs on the event loop. A request's marks
(:class:`Marks`, e.g. a ``tracekit.generation()``) are called as its phases happen:
``admitted()`` when it gets a slot, ``first_token()`` when its prefill returns,
``token()`` for each later token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from tracekit.demo.llm.model import Runner
from tracekit.errors import ConfigError, TracekitError

log = logging.getLogger(__name__)


class Marks(Protocol):
    """What the engine tells about a request's phases (``tracekit.generation()`` fits)."""

    def admitted(self) -> None: ...
    def first_token(self) -> None: ...
    def token(self) -> None: ...


@dataclass
class Request:
    """One request in the engine: its prompt, its tokens so far, its slot once admitted."""

    id: int
    prompt: list[int]
    max_tokens: int
    marks: Marks | None = None
    slot: int | None = None
    tokens: list[int] = field(default_factory=list)
    out: asyncio.Queue[int | BaseException | None] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    done: bool = False

    @property
    def position(self) -> int:
        """Where its latest token goes in its slot's cache."""
        return len(self.prompt) + len(self.tokens) - 1


@dataclass(frozen=True)
class Step:
    """What one iteration did (kept with ``Engine(record=True)``): request ids."""

    admitted: tuple[int, ...]
    decoded: tuple[int, ...]
    finished: tuple[int, ...]
    slots: tuple[int, ...]
    """The slot of each request in the decode step, in ``decoded``'s order."""


class Engine:
    """Continuous batching over ``runner``'s slots; :meth:`start` it in the event loop."""

    def __init__(self, runner: Runner, *, record: bool = False) -> None:
        self.runner = runner
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free = list(range(runner.slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.steps: list[Step] | None = [] if record else None
        self.peak_running = 0
        self._ids = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def slots(self) -> int:
        return self.runner.slots

    def check(self, prompt: Sequence[int], max_tokens: int) -> None:
        """Raise :class:`ConfigError` unless the request fits one slot of the cache."""
        if not prompt or max_tokens < 1:
            raise ConfigError("a request needs a prompt and max_tokens >= 1")
        # the last token is never fed back, so it needs no position
        if len(prompt) + max_tokens - 1 > self.runner.max_seq:
            raise ConfigError(
                f"prompt of {len(prompt)} tokens + {max_tokens} new ones exceeds "
                f"the model's {self.runner.max_seq} positions"
            )

    def submit(self, prompt: Sequence[int], max_tokens: int, marks: Marks | None = None) -> Request:
        """Queue a request; read its tokens with :meth:`stream`."""
        self.check(prompt, max_tokens)
        self._ids += 1
        req = Request(self._ids, list(prompt), max_tokens, marks)
        self.waiting.append(req)
        self._wake.set()
        return req

    async def stream(self, req: Request) -> AsyncGenerator[int, None]:
        """``req``'s tokens as they come; leaving early (a client gone) frees its slot."""
        try:
            while True:
                item = await req.out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not req.done:
                req.cancelled = True
                self._wake.set()

    async def generate(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Every token of one request (untraced: warm-up and tests)."""
        return [t async for t in self.stream(self.submit(prompt, max_tokens))]

    def start(self) -> None:
        """Start the engine loop in the running event loop (once)."""
        if self._task is None:
            # One thread: the runner's cache is not safe for two at once.
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-engine")
            self._task = asyncio.get_running_loop().create_task(self._run(), name="llm-engine")

    async def aclose(self) -> None:
        """Stop the loop after its iteration in flight; requests left get an error."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail(self.waiting, TracekitError("the engine stopped"))
        self._fail(self.running, TracekitError("the engine stopped"))
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # --- the loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        """Iterate until :meth:`aclose`; each iteration admits, prefills, decodes, retires."""
        while not self._closing:
            self._drop_cancelled()
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._iterate()
            except Exception as exc:  # a model failure fails its requests, not the server
                log.exception("engine step failed")
                self._fail(self.running, exc)
                for req in self.running:
                    self._release(req)
                self.running.clear()

    async def _iterate(self) -> None:
        loop, pool = asyncio.get_running_loop(), self._pool
        admitted = []
        while self.waiting and self.free:
            req = self.waiting.popleft()
            req.slot = self.free.pop()
            self.running.append(req)
            admitted.append(req)
            if req.marks is not None:
                req.marks.admitted()
        for req in admitted:
            assert req.slot is not None
            token = await loop.run_in_executor(pool, self.runner.prefill, req.slot, req.prompt)
            self._emit(req, token)
        batch = [s for s in self.running if not s.done and not s.cancelled and s.tokens]
        self.peak_running = max(self.peak_running, len(self.running))
        slots = [s.slot for s in batch if s.slot is not None]  # all of them: each holds one
        if batch:
            tokens = [s.tokens[-1] for s in batch]
            positions = [s.position for s in batch]
            out = await loop.run_in_executor(pool, self.runner.decode, slots, tokens, positions)
            for req, token in zip(batch, out, strict=True):
                self._emit(req, token)
        finished = [s for s in self.running if s.done]
        for req in finished:
            self._release(req)
        self.running = [s for s in self.running if not s.done]
        if self.steps is not None:
            self.steps.append(
                Step(
                    admitted=tuple(s.id for s in admitted),
                    decoded=tuple(s.id for s in batch),
                    finished=tuple(s.id for s in finished),
                    slots=tuple(slots),
                )
            )

    def _emit(self, req: Request, token: int) -> None:
        if req.done or req.cancelled:
            return
        req.tokens.append(token)
        if req.marks is not None:
            if len(req.tokens) == 1:
                req.marks.first_token()
            else:
                req.marks.token()
        req.out.put_nowait(token)
        if len(req.tokens) >= req.max_tokens:
            req.done = True
            req.out.put_nowait(None)

    def _release(self, req: Request) -> None:
        if req.slot is not None:
            self.free.append(req.slot)
            req.slot = None

    def _drop_cancelled(self) -> None:
        if any(s.cancelled for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if not s.cancelled)
        gone = [s for s in self.running if s.cancelled]
        for req in gone:
            self._release(req)
        if gone:
            self.running = [s for s in self.running if not s.cancelled]

    @staticmethod
    def _fail(reqs: Iterable[Request], exc: BaseException) -> None:
        for req in reqs:
            if not req.done:
                req.done = True
                req.out.put_nowait(exc)
