"""`tracekit profile`: arm one on-demand profile capture in a running service."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command

DESCRIPTION = """\
Ask a running service (a process of your user, with tracekit's profiling set up) for one
on-demand torch.profiler capture: tracekit sends it SIGUSR2, and its next executions of
the profiled stage run under the profiler. The Kineto file appears in the service's
profile directory (TRACEKIT_PROFILE_DIR, default ./tracekit-profiles where the service
runs) as tracekit-profile-<service>-<pid>-<n>-<profile_id>.pt.trace.json; ingest it, and
`tracekit explain` of a captured request shows its top ops. A signal carries no number:
--steps is advisory, the service captures its on-demand default number of executions.
A pid that does not exist, is another user's or does not handle SIGUSR2 (the signal
would end it: profiling needs a profile_on rule or TRACEKIT_PROFILE_SIGNAL=1) is exit 2.

Example:
  tracekit profile --pid 4242
  tracekit ingest tracekit-profiles/ && tracekit slow   # exemplars name their profiles
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "profile",
        help="arm one on-demand profile capture in a running service",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "--pid", type=int, required=True, metavar="PID", help="the service's process id"
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="executions to capture (advisory: the service's on-demand default decides)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.facade import arm_profile
    from tracekit.render.text import printable

    for line in arm_profile(args.pid, args.steps).lines():
        print(printable(line))
    return 0
