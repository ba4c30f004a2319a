"""Issue 30's verdict: the grid's fastest fitting points and every seed's pin, head to head.

    python -m benchmarks.grid30_final measure gpt2m --grid G.jsonl --records R.jsonl \\
        --out F.jsonl --gpus 0                                                   # resumable
    python -m benchmarks.grid30_final report F.jsonl

`benchmarks.grid_vs_search` records each pin beside the grid's best, but the two were timed at
different moments, each beside whatever the host's other GPUs were doing then: on one H100
host the same GPT-2 medium point measured 63.6 ms and, on a second host while three searches
compiled beside it, 76.8 ms (results/grid30-nvidia-h100-80gb-hbm3/). A 2 % target needs both
sides timed alike, so ``measure`` times the grid's `FINAL_GRID_POINTS` fastest fitting points
and every seed's pin, each in a fresh process with `FINAL_STEPS`, in `FINAL_ROUNDS` rounds
whose order rotates; ``report`` holds each pin's median against the best grid point's median.
With ``--claims``, workers on several GPUs of one host take a round each (every candidate of a
round on the same GPU), so a head-to-head takes one round's time, not three.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import reference
from benchmarks.common import script_main
from benchmarks.config_sets import WORKLOADS
from benchmarks.grid_vs_search import MARGIN, limit_bytes, read_jsonl, study_of

FINAL_GRID_POINTS = 3
"""How many of the grid's fastest fitting points meet the pins head to head."""
FINAL_ROUNDS = 3
"""Rounds of the head-to-head; each candidate's median over them is compared."""
FINAL_STEPS = {"warmup_steps": 3, "timed_steps": 20}
"""The steps of every head-to-head measurement (the search's pins timed 5, the grid 8)."""


def candidate(
    label: str,
    kind: str,
    family: str,
    workload: str,
    options: dict[str, Any],
    spec: dict[str, Any],
) -> dict[str, Any]:
    """One head-to-head candidate, as `reference.measure` takes it: ``spec`` with
    `FINAL_STEPS`, so every candidate is timed alike whatever steps its search or grid used."""
    return {
        "label": label,
        "kind": kind,
        "family": family,
        "workload": workload,
        "options": options,
        "spec": {**spec, **FINAL_STEPS},
    }


def final_configs(
    name: str, grid: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The head-to-head's candidates for ``name``: the grid's `FINAL_GRID_POINTS` fastest
    points that fit the limit with the margin, then each recorded search's pin (labelled
    ``pin-STUDY``), all with `FINAL_STEPS`."""
    limit = limit_bytes(grid, name)
    if limit is None:
        return []
    fitting = [
        r
        for r in grid
        if r["label"].startswith(f"{name}-")
        and r["result"].get("measurement")
        and r["result"]["measurement"]["peak_device_bytes"] * (1 + MARGIN) <= limit
    ]
    fitting.sort(key=lambda r: r["result"]["measurement"]["step_time_ms"])
    candidates = [
        candidate(r["label"], "grid", "grid30-final", r["workload"], r["options"], r["spec"])
        for r in fitting[:FINAL_GRID_POINTS]
    ]
    workload, options = WORKLOADS[name]
    for row in records:
        if row["workload"] != name:
            continue
        label = "pin-" + study_of(name, row["seed"], row.get("sampler", "tpe"))
        candidates.append(
            candidate(label, "pin", "grid30-final", workload, options, row["pin_spec"])
        )
    return candidates


def final_order(candidates: Sequence[dict[str, Any]], round_: int) -> list[dict[str, Any]]:
    """Round ``round_``'s order: the candidates rotated by the round, so no candidate is always
    first (the one after a long idle) or always last."""
    if not candidates:
        return []
    shift = round_ % len(candidates)
    return [*candidates[shift:], *candidates[:shift]]


def final_rows(final: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per pin of the head-to-head: its median step time against the best grid
    point's median (only rounds that measured; a pin over the limit in any round says so)."""
    by_workload: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for record in final:
        by_workload.setdefault(record["workload_name"], {}).setdefault(record["label"], [])
        by_workload[record["workload_name"]][record["label"]].append(record)
    rows = []
    for name, labels in by_workload.items():
        medians: dict[str, float] = {}
        peaks: dict[str, int] = {}
        for label, records in labels.items():
            measured = [
                r["result"]["measurement"] for r in records if r["result"].get("measurement")
            ]
            if measured:
                medians[label] = statistics.median([m["step_time_ms"] for m in measured])
                peaks[label] = max(m["peak_device_bytes"] for m in measured)
        limit = next(iter(labels.values()))[0]["limit_bytes"]
        grid = {k: v for k, v in medians.items() if not k.startswith("pin-")}
        best = min(grid, key=grid.__getitem__) if grid else None
        for label in sorted(k for k in labels if k.startswith("pin-")):
            ms = medians.get(label)
            rows.append(
                {
                    "workload": name,
                    "pin": label,
                    "rounds": len(labels[label]),
                    "pin_ms": ms,
                    "pin_peak_bytes": peaks.get(label),
                    "fits": label in peaks and peaks[label] <= limit,
                    "limit_bytes": limit,
                    "grid_best": best,
                    "grid_best_ms": grid.get(best) if best else None,
                    "vs_grid_best": None if ms is None or best is None else ms / grid[best] - 1,
                }
            )
    return rows


def final_report(final: Sequence[dict[str, Any]]) -> str:
    """The README's head-to-head table: one row per pin."""
    lines = [
        "| workload | pin | rounds | pin ms (median) | peak GB / limit | grid best | grid ms "
        "(median) | vs grid best |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for row in final_rows(final):
        vs = row["vs_grid_best"]
        peak = row["pin_peak_bytes"]
        over = "" if row["fits"] else " (over)"
        lines.append(
            f"| {row['workload']} | {row['pin']} | {row['rounds']} | {ms(row['pin_ms'])} | "
            f"{'-' if peak is None else f'{peak / 1e9:.2f}'} / "
            f"{row['limit_bytes'] / 1e9:.2f}{over} | "
            f"{row['grid_best']} | {ms(row['grid_best_ms'])} | "
            f"{'-' if vs is None else f'{vs:+.1%}'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p_measure = sub.add_parser("measure", help="one workload's head to head (resumable)")
    p_measure.add_argument("name", choices=sorted(WORKLOADS))
    p_measure.add_argument("--grid", nargs="+", type=Path, required=True)
    p_measure.add_argument("--records", nargs="+", type=Path, required=True)
    p_measure.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended)")
    p_measure.add_argument("--gpus", default="", help="the one GPU index to measure on")
    p_measure.add_argument("--rounds", type=int, default=FINAL_ROUNDS)
    p_measure.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("/tmp/budgettune-bench"),
        help="the grid's (reference.py's) by default: its compile cache serves the grid points",
    )
    p_measure.add_argument("--timeout", type=float, default=420.0, help="seconds per measurement")
    p_measure.add_argument(
        "--claims", type=Path, default=None, help="run only the rounds no other worker claimed"
    )
    p_measure.add_argument(
        "--wait-for",
        nargs="*",
        default=[],
        metavar="STUDY",
        help="studies whose pins must all be recorded first: exit 3, claiming nothing, until then",
    )
    p_report = sub.add_parser("report", help="the README's table")
    p_report.add_argument("final", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.what == "report":
        print(final_report(read_jsonl(args.final)))
        return 0
    return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    grid = read_jsonl(args.grid)
    limit = limit_bytes(grid, args.name)
    if limit is None:
        print(
            f"final {args.name}: full AC or budget 1.0 not measured in "
            f"{', '.join(map(str, args.grid))}",
            file=sys.stderr,
        )
        return 2
    candidates = final_configs(args.name, grid, read_jsonl(args.records))
    if not any(c["kind"] == "pin" for c in candidates):
        print(
            f"final {args.name}: no pin recorded in {', '.join(map(str, args.records))} yet",
            file=sys.stderr,
        )
        return 2
    recorded = {c["label"].removeprefix("pin-") for c in candidates if c["kind"] == "pin"}
    waiting = sorted(set(args.wait_for) - recorded)
    if waiting:
        print(f"final {args.name}: waiting for {', '.join(waiting)}")
        return 3
    measure_rounds(
        args.name, candidates, limit=limit, out=args.out, gpu=args.gpus,
        rounds=args.rounds, claims=args.claims, runs_dir=args.runs_dir, timeout=args.timeout,
    )  # fmt: skip
    return 0


def measure_rounds(
    name: str,
    candidates: Sequence[dict[str, Any]],
    *,
    limit: float,
    out: Path,
    gpu: str,
    rounds: int,
    claims: Path | None,
    runs_dir: Path,
    timeout: float,
) -> None:
    """Head to head under ``name`` (limit ``limit`` bytes): each candidate in a fresh process,
    ``rounds`` rounds in `final_order`, appended to ``out`` (what it holds is skipped; with
    ``claims``, only the rounds no other worker claimed, each on this worker's GPU), then
    `final_report`. Used for issue 30's workloads here and for issue 10's limits by
    `benchmarks.versus`."""
    done = {(r["label"], r["round"]) for r in read_jsonl([out]) if r["workload_name"] == name}
    device = f"cuda:{gpu}" if gpu else "cuda"
    measuring = argparse.Namespace(runs_dir=runs_dir, cache=True, timeout=timeout)
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(rounds):
        order = final_order(candidates, round_)
        if all((c["label"], round_) in done for c in order):
            continue
        if claims and not reference.claim(claims, f"final-{name}-r{round_}"):
            print(f"final {name}: round {round_} claimed by another worker")
            continue
        for config in order:
            if (config["label"], round_) in done:
                continue
            measured = reference.measure(config, device=device, args=measuring)
            measured.update(workload_name=name, round=round_, limit_bytes=limit)
            with out.open("a") as handle:
                handle.write(json.dumps(measured, sort_keys=True) + "\n")
            print(f"round {round_}: {reference.summary(measured)}", flush=True)
    print(final_report([r for r in read_jsonl([out]) if r["workload_name"] == name]))


if __name__ == "__main__":
    script_main(main)
