"""A sharded trial: N fresh ranks under ``torch.distributed.run``, one result file per rank.

The launcher runs::

    python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 0 \\
        -m budgettune.trial.torchrun SPEC.json RESULT.json

so each rank is this module's `main`: a small supervisor (no torch) that runs the measuring
child ``python -m budgettune.trial.child SPEC.json RESULT.rank{r}.json`` and waits for it.
It is there so that a rank that dies without a word (``os._exit``, the kernel's OOM killer, a
segfault) is still named: the supervisor writes that rank's ``crashed`` result with the exit
code or signal. It exits non-zero whenever its rank did not end ``ok``, so torchrun stops every
other rank (SIGTERM): their supervisors kill their children and record them as ``terminated``.
A rank that hangs in a collective instead of dying fails after the process group's timeout
(`TrialRun.collective_timeout_s`); the trial's own timeout kills everything past that.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from budgettune.trial.processes import (
    die_with_parent,
    end_session,
    kill_group,
    spawn,
    wait_unreaped,
)
from budgettune.trial.ranks import rank_result_path
from budgettune.trial.results import (
    TrialOutcome,
    TrialResult,
    death_message,
    read_result,
    write_result_atomically,
)


def torchrun_command(spec_path: Path, result_path: Path, nproc_per_node: int) -> list[str]:
    """The command of a sharded trial (run in its own session by the launcher)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",
        "--nproc-per-node", str(nproc_per_node),
        "--max-restarts", "0",
        "--monitor-interval", "0.1",
        "-m", "budgettune.trial.torchrun",
        str(spec_path), str(result_path),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Supervise one rank: run the measuring child, make sure the rank's result exists."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: torchrun ... -m budgettune.trial.torchrun SPEC.json RESULT.json")
        return 2
    rank = int(os.environ.get("RANK", "0"))
    result_path = rank_result_path(args[1], rank)
    result_path.unlink(missing_ok=True)
    if sys.platform == "linux":
        die_with_parent()  # torchrun starts ranks in their own sessions: follow it if killed
    # The child measures in a session of its own, so what it leaves (it exits with `os._exit`;
    # torch's compile workers may outlive it) is killed with its group, as the launcher does.
    child = spawn(
        [sys.executable, "-m", "budgettune.trial.child", args[0], str(result_path)],
        new_session=True,
    )
    stopped: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)
        kill_group(child)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait_unreaped(child, None)
    returncode = end_session(child)
    assert returncode is not None  # it had exited: the wait is immediate
    try:
        result = read_result(result_path)
    except (OSError, ValueError):
        if stopped:
            result = TrialResult(
                outcome=TrialOutcome.CRASHED,
                error="stopped by the launcher after another rank failed",
                failed_stage="terminated",
            )
        else:
            result = TrialResult(
                outcome=TrialOutcome.CRASHED,
                error=death_message(returncode, who="rank process"),
                failed_stage="died",
            )
        write_result_atomically(result_path, result)
    return 0 if result.outcome is TrialOutcome.OK else 1


if __name__ == "__main__":
    sys.exit(main())
