"""The ranker's tensor work: building model input, the PyTorch MLP, shaping the answer.

A request carries one user and a list of candidate items. :func:`preprocess` crosses
the user's features with each item's embedding (a dozen small tensor ops, as real
feature pipelines are), :class:`Ranker` scores every candidate, and :func:`postprocess`
mixes in the pricing service's margins and keeps the top items. Weights come from a
seeded generator, so every process with the same seed ranks identically.

The functions here are plain: the service wraps them in tracekit stages, and the
start-up warm-up calls them without tracing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from tracekit.demo.features import CANDIDATES, FEATURE_DIM, ITEM_COUNT

INPUT_DIM = 3 * FEATURE_DIM
"""Width of one candidate's model input (item, user×item, |user−item|)."""
TOP_K = 10
"""Items returned per request."""
ENCODER_WIDTH = 512
"""Hidden width of the feature encoder that preprocessing runs."""


class Ranker(nn.Module):
    """An MLP that scores each candidate: ``(batch, candidates, INPUT_DIM) → (batch, candidates)``."""

    def __init__(self, *, hidden: int = 128, layers: int = 2, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        blocks: list[nn.Module] = []
        width = INPUT_DIM
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*blocks)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) / max(1, p.shape[-1]) ** 0.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores: torch.Tensor = self.net(x).squeeze(-1)
        return scores


class FeatureEncoder(nn.Module):
    """Preprocessing's learned feature transform (a residual projection, as feature
    pipelines with embedding encoders have). Its matrix products are long enough that
    torch releases the GIL around each one, which is where a GIL-hogging thread cuts in.
    """

    def __init__(self, *, width: int = ENCODER_WIDTH, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed + 2)
        self.up = nn.Linear(INPUT_DIM, width)
        self.mid = nn.Linear(width, width)
        self.down = nn.Linear(width, INPUT_DIM)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) / max(1, p.shape[-1]) ** 0.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.up(x))
        h = torch.tanh(self.mid(h))
        out: torch.Tensor = x + 0.1 * self.down(h)
        return out


class FeatureStats:
    """Per-column normalisation statistics that every ``preprocess`` reads, under a lock.

    A service may refresh them in the background (:meth:`refresh`); readers then wait
    for the refresh to finish, the usual shape of lock contention in a serving process.
    """

    def __init__(self, sample: torch.Tensor) -> None:
        self.lock = threading.Lock()
        self.sample: list[list[float]] = sample.tolist()
        self.mean = sample.mean(dim=0)
        self.std = sample.std(dim=0).clamp_min(1e-5)

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            return self.mean, self.std

    def refresh(self, hold_s: float, yield_every: int = 8) -> int:
        """Recompute the column means in pure Python, holding the lock for ``hold_s``.

        Deliberately naive (the kind of housekeeping that creeps into a service): passes
        over the sample until the time is up; returns the passes made. Every
        ``yield_every`` rows it sleeps briefly so that the event loop still gets the GIL;
        the lock stays held throughout.
        """
        passes = 0
        with self.lock:
            until = time.perf_counter() + hold_s
            while time.perf_counter() < until:
                sums = [0.0] * len(self.sample[0])
                for n, row in enumerate(self.sample, 1):
                    for j, value in enumerate(row):
                        sums[j] += value
                    if n % yield_every == 0:
                        time.sleep(0.0001)
                passes += 1
        return passes


def sample_inputs(items: torch.Tensor, seed: int = 0, users: int = 16) -> torch.Tensor:
    """Un-normalised preprocess rows for a few random users: what the stats start from."""
    generator = torch.Generator().manual_seed(seed + 3)
    rows = []
    for _ in range(users):
        user = torch.randn(FEATURE_DIM, generator=generator)
        ids = torch.randint(0, ITEM_COUNT, (CANDIDATES,), generator=generator)
        rows.append(_cross(user, items.index_select(0, ids)))
    return torch.cat(rows)


def _cross(user: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    u_rows = user.unsqueeze(0).expand_as(emb)
    return torch.cat([emb, u_rows * emb, (u_rows - emb).abs()], dim=1)


def item_table(seed: int = 0) -> torch.Tensor:
    """The item embedding table, ``(ITEM_COUNT, FEATURE_DIM)``."""
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randn((ITEM_COUNT, FEATURE_DIM), generator=generator)


def preprocess(
    user: np.ndarray,
    item_ids: Sequence[int],
    items: torch.Tensor,
    encoder: FeatureEncoder,
    stats: FeatureStats,
) -> torch.Tensor:
    """Model input for one request: ``(CANDIDATES, INPUT_DIM)``, standardised and encoded."""
    ids = torch.tensor([i % ITEM_COUNT for i in item_ids[:CANDIDATES]], dtype=torch.long)
    if ids.numel() < CANDIDATES:  # short requests are padded with the first items
        ids = torch.cat([ids, torch.arange(CANDIDATES - ids.numel())])
    u = torch.from_numpy(np.array(user, dtype=np.float32, copy=True))
    x = _cross(u, items.index_select(0, ids))
    mean, std = stats.snapshot()
    x = ((x - mean) / std).clamp(-5.0, 5.0)
    with torch.inference_mode():
        encoded: torch.Tensor = encoder(x).contiguous()
    return encoded


def score_batch(model: Ranker, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Score a batch of requests' inputs in one forward pass; one score row per request."""
    with torch.inference_mode():
        scores = model(torch.stack(inputs))
    return list(scores.unbind(0))


def postprocess(item_ids: list[int], scores: torch.Tensor, margins: list[float]) -> list[int]:
    """The TOP_K item ids by score weighted with the pricing margin."""
    n = min(len(item_ids), scores.numel())
    weight = torch.tensor(margins[:n] + [1.0] * (n - len(margins[:n])), dtype=torch.float32)
    value = torch.sigmoid(scores[:n]) * weight
    top = torch.topk(value, k=min(TOP_K, n)).indices.tolist()
    return [item_ids[i] for i in top]


def warm_up(
    model: Ranker,
    encoder: FeatureEncoder,
    items: torch.Tensor,
    stats: FeatureStats,
    batch_size: int,
) -> None:
    """Run every code path once so the first traced request pays no one-off costs."""
    user = np.zeros(FEATURE_DIM, dtype=np.float32)
    ids = list(range(CANDIDATES))
    x = preprocess(user, ids, items, encoder, stats)
    for size in {1, max(1, batch_size)}:
        rows = score_batch(model, [x] * size)
    postprocess(ids, rows[0], [1.0] * len(ids))
