"""One limit's pins head to head with each other and with the grid's fastest points under it.

    python -m benchmarks.versus L3 --grid GRID.jsonl ... --pins A-pin.json B-pin.json \\
        --out versus.jsonl --gpus 0 [--claims DIR]                                # resumable
    python -m benchmarks.grid30_final report versus.jsonl                         # the table

For issue 10's limits (`benchmarks.limits`), a limit searched again (`SEARCHED_AGAIN`) has two
pins or more. Each search's record (`benchmarks.tuner`) compares its pin, re-measured that hour,
with a grid point measured on another day; whether the search again did better or worse than the
first needs both pins and the grid's `FINAL_GRID_POINTS` fastest points under the limit timed
alike: each in a fresh process with `FINAL_STEPS`, rounds in rotating order, medians
(`benchmarks.grid30_final.measure_rounds`, issue 30's head-to-head). The grid suite's
``VS-L3`` step (``bash benchmarks/run.sh grid WAIT_S VS-L3``) runs it, one round per GPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import read_records, script_main
from benchmarks.grid30_final import FINAL_GRID_POINTS, FINAL_ROUNDS, candidate, measure_rounds
from benchmarks.limits import DEFAULT_BATCH, Limit, grid_fastest, limits


def versus_configs(
    limit: Limit, grid: Sequence[dict[str, Any]], pins: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The head-to-head's candidates at ``limit``: the grid's `FINAL_GRID_POINTS` fastest
    points under it (same batch, workload and fixed optimizer as its search), then each pin
    (labelled ``pin-STUDY``), all with `FINAL_STEPS`. A pin of another workload or batch is an
    error: it was not searched at this limit."""
    candidates = [
        candidate(
            r["label"], "grid", "versus", r.get("workload", limit.workload), r["options"],
            r["spec"],
        )
        for r in grid_fastest(
            grid, limit.gb * 1e9, batch=limit.batch, optimizer=limit.fixed_optimizer,
            workload=limit.workload,
        )[:FINAL_GRID_POINTS]
    ]  # fmt: skip
    default_batch = DEFAULT_BATCH.get(limit.workload, 4)
    for pin in pins:
        options = pin.get("workload_options") or {}
        batch = options.get("batch_size", default_batch)
        if pin["workload"] != limit.workload or batch != limit.batch:
            raise SystemExit(
                f"versus {limit.name}: pin of study {pin['study_name']} is for {pin['workload']} "
                f"batch {batch}, not {limit.workload} batch {limit.batch}"
            )
        label = f"pin-{pin['study_name']}"
        candidates.append(candidate(label, "pin", "versus", pin["workload"], options, pin["spec"]))
    return candidates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("limit", choices=["L1", "L2", "L3", "L4", "L5", "V"])
    parser.add_argument("--grid", nargs="+", type=Path, required=True)
    parser.add_argument("--pins", nargs="+", type=Path, required=True, help="pinned config JSONs")
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended)")
    parser.add_argument("--gpus", default="", help="the one GPU index to measure on")
    parser.add_argument("--rounds", type=int, default=FINAL_ROUNDS)
    parser.add_argument(
        "--claims", type=Path, default=None, help="run only the rounds no other worker claimed"
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/budgettune-bench"))
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per measurement")
    args = parser.parse_args(argv)
    grid = read_records(args.grid)
    known = limits(grid)
    if args.limit not in known:
        raise SystemExit(f"versus {args.limit}: its grid point is not in the grid files")
    missing = [str(path) for path in args.pins if not path.is_file()]
    if missing:
        raise SystemExit(f"versus {args.limit}: no pin file {', '.join(missing)}")
    limit = known[args.limit]
    candidates = versus_configs(limit, grid, [json.loads(p.read_text()) for p in args.pins])
    measure_rounds(
        limit.name, candidates, limit=limit.gb * 1e9, out=args.out, gpu=args.gpus,
        rounds=args.rounds, claims=args.claims, runs_dir=args.runs_dir, timeout=args.timeout,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    script_main(main)
