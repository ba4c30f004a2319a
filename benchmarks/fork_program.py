"""One kept run's configuration compiled afresh, forked from trial servers as a search's runs
are, or as new processes as a job is: does the way a process starts change its program?

    python -m benchmarks.fork_program SPEC.json --out DIR [--forked 4] [--fresh 4] [--at-once 4]

``SPEC.json`` is a run folder's (a search's trial or re-verification run: its `TrialRun`).
Every run here starts with compile caches of its own, empty (as a search's cold run), in
``DIR/<kind>-<i>/``; the forked runs come from one pool of trial servers
(`budgettune.trial.launcher.trial_servers`, as a search's process makes it), the fresh ones
are new processes; ``--at-once`` runs of a kind go together (a search's round of cold runs
on one GPU: four), the forked first, then the fresh. One line a run on stdout (kind, its
allocator peak, step time, compile time) and ``DIR/runs.jsonl``. With
``benchmarks.partition_probe`` on the ``PYTHONPATH`` (the search suite's ``fork-greedy``
step) each run's partition and code are recorded too. Issue 44
(`benchmarks/results/h200-probe-2026-11-29/`): a low-budget greedy point's forked cold runs
compiled a program 0.8 GB lighter than five new processes of it did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import script_main


def measure(
    run_spec: Path, out: Path, *, forked: int, fresh: int, at_once: int, timeout_s: float
) -> list[dict[str, object]]:
    """Each run's kind, folder and measurement (or outcome), the forked runs first."""
    from budgettune.trial.launcher import launch_trial, run_env, trial_servers
    from budgettune.trial.trial_run import TrialRun

    run = TrialRun.from_json_dict(json.loads(run_spec.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    servers = trial_servers(run, Path(tempfile.mkdtemp(prefix="bt-fork-servers-")))
    if servers is not None and forked:  # one for each run of a batch, as a search's
        servers.prestart([run_env(run)] * max(1, at_once))
        servers.ready_wait_s = timeout_s  # a forked run waits for its server's imports
    try:
        for kind, count in (("forked", forked), ("fresh", fresh)):

            def one(index: int, kind: str = kind) -> dict[str, object]:
                folder = out / f"{kind}-{index}"
                own = dataclasses.replace(run, cache_root=str(folder / "caches"))
                try:
                    result = launch_trial(
                        own,
                        run_dir=folder,
                        timeout_s=timeout_s,
                        servers=servers if kind == "forked" else None,
                    )
                finally:
                    shutil.rmtree(folder / "caches", ignore_errors=True)  # compiled code only
                m = result.measurement
                log = folder / "trial.log"
                return {
                    "kind": kind,
                    "run": folder.name,
                    # what the launcher did: a pool that cannot serve starts a new process
                    "served": log.exists() and "forked by trial server" in log.read_text(),
                    "outcome": result.outcome.value,
                    "peak_allocated_bytes": m.peak_allocated_bytes if m else None,
                    "step_time_ms": round(m.step_time_ms, 2) if m else None,
                    "compile_s": round(result.phases_s.get("compile", 0.0), 1),
                }

            with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
                rows += list(pool.map(one, range(count)))
    finally:
        if servers is not None:
            servers.close()
    with (out / "runs.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="a run folder's SPEC.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forked", type=int, default=4)
    parser.add_argument("--fresh", type=int, default=4)
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    if min(args.forked, args.fresh) < 0 or args.forked + args.fresh == 0 or args.at_once < 1:
        parser.error("--forked and --fresh are counts (at least one run in all), --at-once >= 1")
    if not args.timeout_s > 0:
        parser.error("--timeout-s must be positive")
    rows = measure(
        args.spec,
        args.out,
        forked=args.forked,
        fresh=args.fresh,
        at_once=args.at_once,
        timeout_s=args.timeout_s,
    )
    for row in rows:
        print(" ".join(f"{key}={value}" for key, value in row.items()))
    return 0 if all(row["outcome"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    script_main(main)
