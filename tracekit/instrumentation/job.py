"""Who this process is in a training job: rank, world size and local rank.

Read from ``torch.distributed`` when a process group is initialised, else from
torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``. torch is never imported here: a
process that did not import it has no process group, so ``sys.modules`` is asked.
:func:`tracekit.instrumentation.setup.configure` puts :func:`job_resource` on the
resource, and :func:`tracekit.train_steps` stamps the identity on every step span.
Kept apart from :mod:`.training` so that ``setup`` can use it without an import cycle.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from tracekit import conventions as cv
from tracekit.instrumentation import _guard

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
"""torchrun's variables: the job identity when ``torch.distributed`` is not initialised."""


@dataclass(frozen=True)
class JobIdentity:
    """This process's place in the training job."""

    rank: int
    world_size: int
    local_rank: int

    def attributes(self) -> dict[str, int]:
        """As span or resource attributes (``tracekit.rank``…)."""
        return {cv.RANK: self.rank, cv.WORLD_SIZE: self.world_size, cv.LOCAL_RANK: self.local_rank}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _initialised_group() -> JobIdentity | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return JobIdentity(dist.get_rank(), dist.get_world_size(), _env_int(ENV_LOCAL_RANK, 0))
    except Exception as exc:  # a half-torn-down group must not stop training
        _guard.report("training: job identity", exc)
    return None


def job_identity() -> JobIdentity:
    """Rank and world size from ``torch.distributed`` when initialised, else ``RANK``…"""
    group = _initialised_group()
    if group is not None:
        return group
    return JobIdentity(
        _env_int(ENV_RANK, 0), _env_int(ENV_WORLD_SIZE, 1), _env_int(ENV_LOCAL_RANK, 0)
    )


def in_job() -> bool:
    """Whether this process is part of a training job (a process group, or torchrun's env)."""
    if any(os.environ.get(k, "").strip() for k in (ENV_RANK, ENV_WORLD_SIZE)):
        return True
    return _initialised_group() is not None


def job_resource() -> dict[str, int]:
    """``tracekit.rank``/``world_size``/``local_rank`` when in a job, else nothing.

    A serving process is in no job and gets no rank attributes.
    """
    return job_identity().attributes() if in_job() else {}


def resource_attributes() -> dict[str, int]:
    """The job identity as resource attributes (``configure()`` adds them by itself)."""
    return job_identity().attributes()
