"""The re-verification rounds of kept searches, replayed under the noise rule of the code and
under the one before it (the largest noise of any candidate for every pair, to aaa686a).

    python -m benchmarks.reverify_replay benchmarks/results/h200-probe-2026-11-29/logs-runs-*.tgz

Each archive is a search's ``logs-runs-<study>.tgz`` (every run's SPEC.json, RESULT.json and
log, as the search suite keeps them). The replay takes the trials' step times and each
candidate's fresh runs in the order the search made them, and walks the rounds as
`budgettune.study.reverify` does (the first round's candidates as the search ran them, a later
round only the contenders, the rounds ending when the leader stands alone and its noise is at
most `SETTLED_NOISE`, or after three); where a rule asks for a run the search did not make, it
says so. Every candidate fits here (the replay ranks by median step time), as in the searches
it was written for. A round here is a wall on one GPU of four slots; a search with more slots
than candidates sends several rounds at once (`reverify._rounds`), so there fewer rounds save
runs, not wall.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import script_main


@dataclass(frozen=True)
class _Measurement:
    step_time_ms: float


@dataclass(frozen=True)
class _Run:
    measurement: _Measurement


def kept_runs(archive: Path) -> tuple[dict[int, float], dict[int, list[float]]]:
    """The trials' step times, and each re-verified trial's fresh runs in the order made (the
    unconstrained baseline's, measured for the report only, left out)."""
    trials: dict[int, float] = {}
    runs: dict[int, dict[int, float]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if parts[-1] != "RESULT.json" or len(parts) < 2:
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            result = json.load(handle)
            if not result.get("measurement"):
                continue
            ms = float(result["measurement"]["step_time_ms"])
            name = parts[-2].split("-")
            if name[0] == "trial" and len(name) == 2:
                trials[int(name[1])] = ms
            elif name[0] == "reverify" and len(name) == 3 and name[1].isdigit():
                runs.setdefault(int(name[1]), {})[int(name[2])] = ms
    return trials, {n: [kept[k] for k in sorted(kept)] for n, kept in runs.items()}


def replay(
    trials: dict[int, float], runs: dict[int, list[float]], rule: str, rounds: int = 3
) -> tuple[list[list[int]], str]:
    """The candidates of each round under ``rule`` (``pair``: the code's; ``largest``: before
    aaa686a), and the leader at the end (or why the replay stopped)."""
    from budgettune.pinning import Candidate
    from budgettune.study.reverify import SETTLED_NOISE, contenders, noises_of
    from budgettune.trial.spec import TrialSpec

    batch = [
        Candidate(trial_number=n, spec=TrialSpec(seed=n), step_time_ms=trials[n], peak_bytes=1)
        for n in runs
    ]
    pool, got, walked = list(batch), {}, []
    for index in range(rounds):
        if any(len(runs[c.trial_number]) <= index for c in pool):
            return walked, "asks for a run the search did not make"
        for c in pool:
            got.setdefault(c.trial_number, []).append(
                _Run(_Measurement(runs[c.trial_number][index]))
            )
        walked.append([c.trial_number for c in pool])
        ranked = sorted(
            (
                (statistics.median(r.measurement.step_time_ms for r in got[c.trial_number]), c, [])
                for c in batch
                if c.trial_number in got
            ),
            key=lambda entry: entry[0],
        )
        noise = noises_of(batch, got)  # type: ignore[arg-type]
        if rule == "largest":
            largest = noise.worst
            pool = [c for ms, c, _ in ranked if ms <= ranked[0][0] * (1 + 2 * largest)]
            settled = largest <= SETTLED_NOISE
        else:
            pool = contenders(ranked, noise)
            settled = bool(pool) and noise.between(pool[0], pool[0]) <= SETTLED_NOISE
        if not pool or (len(pool) == 1 and settled):
            break
    return walked, f"leader trial {ranked[0][1].trial_number}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("archives", nargs="+", type=Path, help="logs-runs-<study>.tgz files")
    args = parser.parse_args(argv)
    for archive in args.archives:
        try:
            trials, kept = kept_runs(archive)
        except tarfile.TarError as exc:
            raise OSError(
                f"{archive}: not a search's logs archive (a .tgz of run folders)"
            ) from exc
        runs = {n: times for n, times in kept.items() if n in trials}
        if not runs:
            print(f"{archive}: no re-verification runs")
            continue
        print(archive)
        for n, times in sorted(runs.items()):
            print(f"  trial {n}: {trials.get(n, float('nan')):.2f} ms, fresh runs {times}")
        for rule in ("largest", "pair"):
            walked, end = replay(trials, runs, rule)
            print(f"  {rule:8s} rounds {walked}: {end}")
    return 0


if __name__ == "__main__":
    script_main(main)
