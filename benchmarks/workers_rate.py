"""Trials per hour of each study in a storage, from the trials' own start and end times.

R=benchmarks/results/h200x2-workers-2026-11-22     # from the repository root
python -m benchmarks.workers_rate sqlite:///$R/workers.db --logs $R/2workers-logs.txt \
    --one-worker llama-1worker

For each study: finished trials, the wall time from the first trial's start to the last finished
trial's end, trials/hour over that span, and the workers' mean *cycle* (start of one of a worker's
trials to the start of its next: the trial, its bookkeeping and the pick of the next point), which
still measures a study cut short after one trial. A trial's worker is its ``worker`` user attr
(``host:device``, recorded since 2026-11-22); for older studies, ``--logs`` reads it from the
workers' logs (``==> .../cuda0.log <==`` sections of ``trial N: ...`` lines, as ``tail -n +1``
prints them); a study whose trials name no worker and are in no log has no cycle.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from benchmarks.common import script_main, study_trials
from budgettune.storage.user_attrs import WORKER_ATTR

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class Rate:
    """Throughput of one study."""

    finished: int
    """Trials that finished (complete or pruned)."""
    span_s: float
    """First trial start to last finished trial's end, in seconds."""
    per_hour: float
    """finished / span, per hour (0 when nothing finished)."""
    workers: int
    """Distinct workers that ran trials (0: not known for every trial)."""
    cycle_s: float | None
    """Mean start-to-next-start of one worker's consecutive trials (None: no such pair)."""


def rate(trials: Sequence[FrozenTrial], workers_by_number: dict[int, str] | None = None) -> Rate:
    """Trials per hour of a study, and the workers' mean cycle.

    Args:
        trials: the study's trials, any state.
        workers_by_number: worker of each trial number, for trials without a ``worker`` attr.
    """
    done = [t for t in trials if t.state in FINISHED and t.datetime_start and t.datetime_complete]
    known = workers_by_number or {}
    starts: dict[str, list[datetime]] = defaultdict(list)
    unattributed = False
    for trial in trials:
        if trial.datetime_start is None:
            continue
        worker = trial.user_attrs.get(WORKER_ATTR, known.get(trial.number))
        if worker is None:
            unattributed = True
        starts[str(worker)].append(trial.datetime_start)
    cycles = [
        (later - earlier).total_seconds()
        for times in map(sorted, starts.values())
        for earlier, later in zip(times, times[1:], strict=False)
    ]
    cycle = statistics.fmean(cycles) if cycles and not unattributed else None
    workers = 0 if unattributed else len(starts)
    if not done:
        return Rate(0, 0.0, 0.0, workers, cycle)
    first = min(t.datetime_start for t in done if t.datetime_start is not None)
    last = max(t.datetime_complete for t in done if t.datetime_complete is not None)
    span = (last - first).total_seconds()
    per_hour = len(done) * 3600.0 / span if span > 0 else 0.0
    return Rate(len(done), span, per_hour, workers, cycle)


def workers_from_logs(paths: Sequence[Path]) -> dict[str, dict[int, str]]:
    """``{study: {trial number: worker}}`` from worker logs (``tail -n +1`` of several).

    A section header ``==> .../<study>/workers/cuda0.log <==`` names the study and worker;
    each ``trial N: ...`` line under it is one of that worker's trials.
    """
    found: dict[str, dict[int, str]] = defaultdict(dict)
    header = re.compile(r"^==> .*?([^/]+)/workers/([^/]+)\.log <==$")
    line_re = re.compile(r"^trial (\d+): ")
    for path in paths:
        study = worker = None
        for line in path.read_text(errors="replace").splitlines():
            match = header.match(line.strip())
            if match:
                study, worker = match.group(1), match.group(2)
                continue
            match = line_re.match(line)
            if match and study is not None and worker is not None:
                found[study][int(match.group(1))] = worker
    return dict(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage", help="SQLAlchemy URL of the studies, e.g. sqlite:///x.db")
    parser.add_argument("--logs", nargs="*", type=Path, default=[], help="worker logs")
    parser.add_argument(
        "--one-worker",
        action="append",
        default=[],
        metavar="STUDY",
        help="every trial of STUDY ran on one worker (a run whose worker log was lost)",
    )
    args = parser.parse_args(argv)
    from_logs = workers_from_logs(args.logs)
    studies = study_trials(args.storage)
    print(
        "| study | workers | finished | first start to last end, s | trials/hour over it "
        "| mean cycle per worker, s | trials/hour, workers x 3600 / cycle |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, trials in studies.items():
        known = from_logs.get(name)
        if name in args.one_worker:
            known = {t.number: "the worker" for t in trials}
        r = rate(trials, known)
        cycle = "-" if r.cycle_s is None else f"{r.cycle_s:.1f}"
        by_cycle = "-" if not (r.cycle_s and r.workers) else f"{r.workers * 3600 / r.cycle_s:.0f}"
        workers = r.workers or "?"
        print(
            f"| {name} | {workers} | {r.finished} | {r.span_s:.1f} | "
            f"{r.per_hour:.0f} | {cycle} | {by_cycle} |"
        )
    return 0


if __name__ == "__main__":
    script_main(main)
