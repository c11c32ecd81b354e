"""A tiny decoder-only transformer and the KV cache it decodes from.

:class:`TinyDecoder` is a GPT-style model (learned positions, pre-norm blocks of causal
self-attention and an MLP) over bytes: vocabulary 256, so text is its own tokenisation
(:func:`encode`). Its weights are random from a seed — nothing to download — and it
decodes greedily, so the same prompt gives the same tokens in every process with the
same seed.

:class:`Runner` holds the model and its KV cache, one row (*slot*) per sequence:
:meth:`Runner.prefill` runs a prompt through the model, writes its keys and values into
a slot and returns the first output token; :meth:`Runner.decode` runs one step for a
batch of slots — each feeds its latest token at its own position and attends over its
own cached prefix — and returns the next token of each, the step padded to a fixed
number of rows. Both also wait for the stand-in accelerator (:class:`Device`). :meth:`TinyDecoder.greedy` is the same model without a cache (every
step recomputes the whole sequence): the tests' reference for what batched decoding
must produce.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
"""Tokens are bytes."""
D_MODEL = 128
HEADS = 4
LAYERS = 2
MAX_SEQ = 256
"""Positions the model knows: prompt plus output tokens of one sequence."""


def encode(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


class _Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.ln2(x))))
        return out

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values of ``x`` (..., d) as (..., heads, head_dim) each."""
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, self.heads, -1)).unbind(-3)
        return q, k, v


class TinyDecoder(nn.Module):
    """A randomly initialised decoder-only transformer over bytes."""

    def __init__(
        self,
        *,
        d_model: int = D_MODEL,
        heads: int = HEADS,
        layers: int = LAYERS,
        max_seq: int = MAX_SEQ,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.d_model, self.heads, self.max_seq = d_model, heads, max_seq
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "ln" not in name:
                    p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)
        self.to(dtype)
        self.eval()

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def stack(self) -> list[_Block]:
        """The blocks, typed (``nn.ModuleList`` hands out plain modules)."""
        return [b for b in self.blocks if isinstance(b, _Block)]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.ln_f(x))
        return out

    @torch.inference_mode()
    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        """``n`` tokens after ``prompt``, recomputing the whole sequence at every step."""
        ids = list(prompt)
        out: list[int] = []
        for _ in range(n):
            x = self.embed(torch.tensor([ids])) + self.pos(torch.arange(len(ids)))
            for block in self.stack:
                q, k, v = (t.transpose(1, 2) for t in block.split(x))  # (1, heads, L, hd)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = block.mlp(x + block.out(a.transpose(1, 2).flatten(-2)))
            token = int(self.logits(x[0, -1]).argmax())
            out.append(token)
            ids.append(token)
        return out


@dataclass(frozen=True)
class Device:
    """The stand-in accelerator: the time a GPU would add, waited with the GIL released.

    A decode step on a GPU costs about the same for any batch that fits (it reads the
    weights once either way) and a prefill grows with the prompt, while the host thread
    that drives it sits waiting and the event loop streams tokens meanwhile. The tiny
    CPU model alone has neither shape: its whole step is CPU that Python's per-token
    streaming competes with. So each decode step also waits ``decode_ms``, and each
    prefill ``prefill_ms`` + ``prefill_token_ms`` per prompt token.
    """

    decode_ms: float = 0.0
    prefill_ms: float = 0.0
    prefill_token_ms: float = 0.0


class Runner:
    """The model, its KV cache of ``slots`` sequences and the stand-in ``device``; one
    thread at a time.

    Every decode step runs at least ``decode_rows`` rows, the unused ones padding (fed
    from a scratch row of the cache that no sequence owns), as engines that capture
    CUDA graphs pad a step to a captured batch size: its CPU part then costs the same
    for any batch up to that size, as the device's does.

    ``decode_extra`` > 0 makes every decode step also multiply the batch's hidden
    states through a ``decode_extra``-square matrix and drop the result (the ``decode``
    regression: a slower step, the same tokens).
    """

    def __init__(
        self,
        model: TinyDecoder,
        *,
        slots: int,
        decode_rows: int = 1,
        device: Device = Device(),
        decode_extra: int = 0,
    ) -> None:
        if slots < 1:
            raise ValueError("a KV cache needs at least one slot")
        self.model = model
        self.slots = slots
        self.decode_rows = decode_rows
        self.device = device
        p = next(model.parameters())
        # one row more than the sequences: the padding rows' scratch space
        shape = (model.layers, slots + 1, model.heads, model.max_seq, model.head_dim())
        self.keys = torch.zeros(shape, dtype=p.dtype)
        self.values = torch.zeros(shape, dtype=p.dtype)
        self.extra: tuple[torch.Tensor, torch.Tensor] | None = None
        if decode_extra > 0:
            generator = torch.Generator().manual_seed(decode_extra)
            lift = torch.randn(model.d_model, decode_extra, generator=generator, dtype=p.dtype)
            square = torch.randn(decode_extra, decode_extra, generator=generator, dtype=p.dtype)
            self.extra = (lift, square / decode_extra**0.5)

    @property
    def max_seq(self) -> int:
        return self.model.max_seq

    @torch.inference_mode()
    def prefill(self, slot: int, prompt: Sequence[int]) -> int:
        """Run ``prompt`` into ``slot``'s cache (positions 0..len-1); the first output token."""
        m = self.model
        n = len(prompt)
        x = m.embed(torch.tensor([list(prompt)])) + m.pos(torch.arange(n))
        for i, block in enumerate(m.stack):
            q, k, v = (t.transpose(1, 2) for t in block.split(x))  # (1, heads, n, hd)
            self.keys[i, slot, :, :n] = k[0]
            self.values[i, slot, :, :n] = v[0]
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = block.mlp(x + block.out(a.transpose(1, 2).flatten(-2)))
        token = int(m.logits(x[0, -1]).argmax())
        _wait(self.device.prefill_ms + n * self.device.prefill_token_ms)
        return token

    @torch.inference_mode()
    def decode(
        self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]
    ) -> list[int]:
        """One step for a batch: slot ``slots[b]`` feeds ``tokens[b]`` at ``positions[b]``
        (its cache holds positions below it) and gets its next token."""
        m = self.model
        n = len(slots)
        pad = max(0, self.decode_rows - n)
        rows = torch.tensor([*slots, *[self.slots] * pad])
        at = torch.tensor([*positions, *[0] * pad])
        span = int(at.max()) + 1
        # (batch, 1, 1, span): each row sees its own prefix and the token it feeds
        visible = (torch.arange(span)[None, :] <= at[:, None])[:, None, None, :]
        x = m.embed(torch.tensor([*tokens, *[0] * pad])) + m.pos(at)  # (rows, d)
        for i, block in enumerate(m.stack):
            q, k, v = block.split(x)  # (batch, heads, hd)
            keys, values = self.keys[i], self.values[i]
            keys[rows, :, at] = k
            values[rows, :, at] = v
            a = F.scaled_dot_product_attention(
                q[:, :, None], keys[rows, :, :span], values[rows, :, :span], attn_mask=visible
            )
            x = block.mlp(x + block.out(a.flatten(1)))
        if self.extra is not None:
            lift, square = self.extra
            torch.tanh(x @ lift) @ square  # the regression's wasted work
        out = [int(t) for t in m.logits(x[:n]).argmax(-1)]
        _wait(self.device.decode_ms)
        return out


def _wait(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)  # the GIL is released: the event loop streams meanwhile
