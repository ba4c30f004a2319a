"""The tuner against the grid: issue 10's limits L1-L5 and V (ViT), their searches, their records.

    python -m benchmarks.tuner limits benchmarks/results/llama-grid-h200.jsonl ...
        # L1-L5 from the grid's measured peaks (those the grid holds)
    python -m benchmarks.tuner run L1 --grid benchmarks/results/llama-grid-h200.jsonl \\
        --storage sqlite:///tuner.db --out benchmarks/results/tuner-h200.jsonl
        # `budgettune search` at L1 (<= 20 trials, 5 re-measurements), then its record
    python -m benchmarks.tuner record --storage sqlite:///S.db --pin PIN.json \\
        --limit L1 --grid GRID.jsonl ... --out tuner-h200.jsonl
        # the record of a search that already ran (--limit: the limit's baseline and target)

A record (one JSON line, device, torch version and date in it) holds the pinned config, its
worst re-measured peak and median step time, its slowdown against the limit's baseline, both as
the search re-measured it (as many fresh runs as the pin, same machine, same hour; the target
is judged on this one when the pin has it) and as the grid measured it (the user's compile at
budget 1.0, optimizer as written; for L4, whose optimizer is fixed, fused AdamW at budget 1.0;
for L5, where budget 1.0 does not fit, full block AC), whether the target is met, the best grid
configuration under the same limit, the trials and wall time until a feasible trial came within
2 % of that grid best (None: never), and the search's total wall time (first trial start to the
pin; ``active_wall_s``, added by hand, when the search was cut into several device commands)
and the GPUs it ran on (``gpus``; added by hand to the records from before the field).
``report.py`` renders these records as the README's tuner table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from benchmarks.common import kept_storage, read_records, script_main, study_trials, target_cell
from benchmarks.limits import (
    DEFAULT_BATCH,
    Limit,
    first_measured,
    grid_best,
    limits,
    pin_file,
    split_run,
)
from benchmarks.limits import study_name as study_name  # suites/grid-limits.sh reads it here
from budgettune.storage.trials import is_feasible
from budgettune.trial.spec import TrialSpec

WITHIN = 0.02
"""A trial is 'as good as the grid' when its step time is within this of the grid's best."""
BASELINE_LABEL = {4: "budget-1.0", 8: "b8-budget-1.0", 64: "b64-ac-every-1"}
"""The grid baseline a batch size's targets are stated against by default: the user's
unconstrained compile, or full block AC at B=64, where that does not fit."""


def first_within(
    trials: Sequence[optuna.trial.FrozenTrial], target_ms: float
) -> tuple[int, float] | None:
    """(trials finished, wall seconds) when a feasible trial first came within 2 % of target.

    Trials are taken in the order they finished; the wall time runs from the first trial's start.
    """
    started = [t.datetime_start for t in trials if t.datetime_start is not None]
    finished = sorted(
        (t for t in trials if t.datetime_complete is not None),
        key=lambda t: t.datetime_complete or datetime.datetime.max,
    )
    if not started:
        return None
    for count, trial in enumerate(finished, start=1):
        if is_feasible(trial) and trial.user_attrs["step_time_ms"] <= (1 + WITHIN) * target_ms:
            assert trial.datetime_complete is not None
            return count, (trial.datetime_complete - min(started)).total_seconds()
    return None


def record(
    *,
    name: str,
    trials: Sequence[optuna.trial.FrozenTrial],
    pin: dict[str, Any],
    grid: Sequence[dict[str, Any]],
    batch: int = 4,
    optimizer: str | None = None,
    baseline_label: str | None = None,
    max_slowdown: float | None = None,
    workload: str = "builtin:llama",
    gpus: int | None = None,
) -> dict[str, Any]:
    """The per-limit record of a finished search (see the module docstring).

    Args:
        baseline_label: the grid baseline of the target (default: the user's, as written).
        max_slowdown: the target on the pin's slowdown against it (None: no target).
        gpus: the GPUs the search ran its trials on (None: not known).
    """
    baseline_label = baseline_label or BASELINE_LABEL.get(batch)
    limit = float(pin["limit_bytes"])
    metric = pin["mem_metric"]
    measured = pin["measured"]
    best = grid_best(
        grid, limit, metric=metric, batch=batch, optimizer=optimizer, workload=workload
    )
    baseline = first_measured(grid, baseline_label) if baseline_label else None
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    created = datetime.datetime.fromisoformat(pin["created_at"])
    first = min(starts).replace(tzinfo=datetime.timezone.utc) if starts else None
    within = first_within(trials, best["result"]["measurement"]["step_time_ms"]) if best else None

    def point(r: dict[str, Any] | None) -> dict[str, Any] | None:
        if r is None:
            return None
        m = r["result"]["measurement"]
        return {
            "label": r["label"],
            "peak_device_bytes": m["peak_device_bytes"],
            "step_time_ms": m["step_time_ms"],
            "peak_phase": m["peak_phase"],
        }

    pin_ms = float(measured["step_time_ms"])
    base_point, best_point = point(baseline), point(best)
    vs_baseline = None if base_point is None else pin_ms / base_point["step_time_ms"] - 1
    # The same baseline as re-measured by the search itself (as many fresh runs as the pin, on
    # the same machine at the same time): full block AC where that is the baseline (L5).
    own = (
        pin.get("full_ac")
        if (baseline_label or "").endswith("ac-every-1")
        else pin.get("baseline")
    )
    vs_study = None if not own or own.get("slowdown") is None else float(own["slowdown"])
    judged = vs_study if vs_study is not None else vs_baseline
    return {
        "kind": "tuner",
        "name": name,
        "limit_bytes": limit,
        "mem_metric": metric,
        "workload": workload,
        "batch_size": batch,
        "fixed_optimizer": optimizer,
        "study": pin["study_name"],
        "trials": len(trials),
        "pin": {
            "config": TrialSpec.from_json_dict(pin["spec"]).describe(),
            "spec": pin["spec"],
            "peak_worst_bytes": measured["peak_worst_bytes"],
            "peak_phase": measured["peak_phase"],
            "step_time_ms": pin_ms,
            "runs": measured["runs"],
            "advice": pin.get("advice", ""),
        },
        "baseline": base_point,
        "vs_baseline": vs_baseline,
        "vs_study_baseline": vs_study,
        "study_baseline_runs": None if not own else own.get("runs"),
        "max_slowdown": max_slowdown,
        "target_met": None
        if max_slowdown is None or judged is None
        else bool(judged <= max_slowdown and measured["peak_worst_bytes"] <= limit),
        "grid_best": best_point,
        "vs_grid_best": None if best_point is None else pin_ms / best_point["step_time_ms"] - 1,
        "within_2pct": None if within is None else {"trials": within[0], "wall_s": within[1]},
        "total_wall_s": None if first is None else (created - first).total_seconds(),
        "gpus": gpus,
        "device": pin["fingerprint"]["device_name"],
        "torch_version": pin["fingerprint"]["torch_version"],
        "date": pin["created_at"],
    }


WALL_TARGET_S = {1: 20 * 60.0, 4: 6 * 60.0}
"""Issue 10's targets for 20 trials + re-verification of ``studies/llama-1b.toml``, by GPUs."""


def wall_record(
    *,
    name: str,
    trials: Sequence[optuna.trial.FrozenTrial],
    pin: dict[str, Any],
    fresh_runs: int,
    gpus: int,
    command_wall_s: float | None = None,
) -> dict[str, Any]:
    """The wall-time record of one uninterrupted search: first trial start to the last trial's
    end (the trials), from there to the pin (re-verification and baselines), and in all; the
    target is judged on the whole command's wall time (its start-up checks too) when given."""
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    if not starts or not ends:
        raise SystemExit(f"{pin['study_name']}: no finished trial")
    utc = datetime.timezone.utc
    first, last = min(starts).replace(tzinfo=utc), max(ends).replace(tzinfo=utc)
    created = datetime.datetime.fromisoformat(pin["created_at"])
    total = (created - first).total_seconds()
    target = WALL_TARGET_S.get(gpus)
    return {
        "kind": "wall",
        "name": name,
        "study": pin["study_name"],
        "limit_bytes": float(pin["limit_bytes"]),
        "gpus": gpus,
        "trials": len(trials),
        "trials_wall_s": (last - first).total_seconds(),
        "fresh_runs": fresh_runs,
        "reverify_wall_s": (created - last).total_seconds(),
        "total_wall_s": total,
        "command_wall_s": command_wall_s,
        "target_s": target,
        "target_met": None
        if target is None
        else (command_wall_s if command_wall_s is not None else total) <= target,
        "device": pin["fingerprint"]["device_name"],
        "torch_version": pin["fingerprint"]["torch_version"],
        "date": pin["created_at"],
    }


def _fresh_runs(url: str, study: str) -> int:
    """How many fresh re-measurements (``reverify``) the study holds."""
    with kept_storage(url) as store:
        return len(store.measurements(study, kind="reverify"))


def _append(out: Path, row: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")


def search_command(
    limit: Limit,
    *,
    storage: str,
    pin: Path,
    trials: int,
    reverify: int,
    gpus: str = "",
    seed: int | None = None,
) -> list[str]:
    """The `budgettune search` of one limit (study named after it, so a rerun resumes it);
    ``seed``: the search again with that sampler seed, in a study of its own (`split_run`)."""
    study = limit.study if seed is None else study_name(f"{limit.name}-s{seed}")
    command = [
        sys.executable, "-m", "budgettune.cli", "search", "studies/llama-1b.toml",
        "--max-mem", f"{limit.gb:.3f}GB", "--study", study, "--margin", f"{limit.margin:g}",
        "--storage", storage, "--trials", str(trials), "--top-k", "3",
        "--reverify", str(reverify), "--output", str(pin),
    ]  # fmt: skip
    if limit.workload != "builtin:llama":
        command += ["--workload", limit.workload]
    if limit.batch != DEFAULT_BATCH.get(limit.workload, 4):
        command += ["-o", f"batch_size={limit.batch}"]
    if limit.fixed_optimizer:
        command += ["--fix", f"optimizer_impl={limit.fixed_optimizer}"]
    if gpus:
        command += ["--gpus", gpus]
    if seed is not None:
        command += ["--seed", str(seed)]
    return command


def _limit_token(token: str) -> str:
    """argparse type of a limit's search (`split_run`): the token, or a one-line usage error."""
    try:
        split_run(token)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return token


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p_limits = sub.add_parser("limits", help="print L1-L5 from the grid")
    p_limits.add_argument("grid", nargs="+", type=Path)
    p_run = sub.add_parser("run", help="search at one limit, then append its record")
    p_run.add_argument(
        "limit", type=_limit_token, help="L1-L5 or V; L3-s1: L3's search again with sampler seed 1"
    )
    p_run.add_argument("--grid", nargs="+", type=Path, required=True)
    p_run.add_argument("--storage", required=True)
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("--pins", type=Path, default=Path("benchmarks/results"))
    p_run.add_argument("--trials", type=int, default=20)
    p_run.add_argument("--reverify", type=int, default=5)
    p_run.add_argument("--gpus", default="", help="GPU indices for `search --gpus` (default: one)")
    p_rec = sub.add_parser("record", help="append the record of a search that already ran")
    p_rec.add_argument("--storage", required=True)
    p_rec.add_argument("--pin", type=Path, required=True)
    p_rec.add_argument("--name", help="the record's name (default: --limit's)")
    p_rec.add_argument(
        "--limit",
        choices=["L1", "L2", "L3", "L4", "L5", "V"],
        help="take batch, optimizer, baseline and target from this limit",
    )
    p_rec.add_argument("--grid", nargs="+", type=Path, required=True)
    p_rec.add_argument("--batch", type=int, default=4)
    p_rec.add_argument("--optimizer", help="restrict the grid best to this optimizer_impl")
    p_rec.add_argument("--out", type=Path, required=True)
    p_wall = sub.add_parser("wall", help="append the wall-time record of a finished search")
    p_wall.add_argument("--storage", required=True)
    p_wall.add_argument("--pin", type=Path, required=True)
    p_wall.add_argument("--gpus", type=int, required=True, help="GPUs the search ran on")
    p_wall.add_argument("--name", default="studies/llama-1b.toml as written")
    p_wall.add_argument(
        "--command-wall-s", type=float, help="the search command's own wall time, start-up in"
    )
    p_wall.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.what == "wall":
        pin = json.loads(args.pin.read_text())
        name = pin["study_name"]
        row = wall_record(
            name=args.name,
            trials=study_trials(args.storage, [name])[name],
            pin=pin,
            fresh_runs=_fresh_runs(args.storage, name),
            gpus=args.gpus,
            command_wall_s=args.command_wall_s,
        )
        _append(args.out, row)
        print(json.dumps(row, indent=1))
        return 0
    if args.what == "limits":
        for limit in limits(read_records(args.grid)).values():
            print(
                f"{limit.name} {limit.gb:.3f} GB  {limit.workload} B={limit.batch}  "
                f"{limit.why}; target: {target_cell(limit.max_slowdown)} vs {limit.baseline}"
            )
        return 0
    if args.what == "run":
        grid = read_records(args.grid)
        known = limits(grid)
        name, seed = split_run(args.limit)
        if name not in known:
            raise SystemExit(f"{name}: its grid point is not measured yet; run the grid first")
        limit = known[name]
        pin = args.pins / pin_file(args.limit)
        command = search_command(
            limit, storage=args.storage, pin=pin, trials=args.trials, reverify=args.reverify,
            gpus=args.gpus, seed=seed,
        )  # fmt: skip
        print(" ".join(command), flush=True)
        code = subprocess.call(command)
        if code != 0:
            return code
        study = study_name(args.limit)
        trials = study_trials(args.storage, [study])[study]
        row = record(
            name=limit.name if seed is None else f"{limit.name}, sampler seed {seed}",
            trials=trials, pin=json.loads(pin.read_text()), grid=grid,
            batch=limit.batch, optimizer=limit.fixed_optimizer, baseline_label=limit.baseline,
            max_slowdown=limit.max_slowdown, workload=limit.workload,
            gpus=len(args.gpus.split(",")) if args.gpus else 1,
        )  # fmt: skip
        _append(args.out, row)
        print(json.dumps(row, indent=1))
        return 0
    pin = json.loads(args.pin.read_text())
    name = pin["study_name"]
    grid = read_records(args.grid)
    trials = study_trials(args.storage, [name])[name]
    if args.limit:
        known = limits(grid)
        if args.limit not in known:
            raise SystemExit(f"{args.limit}: its grid point is not in {args.grid}")
        limit = known[args.limit]
        row = record(
            name=args.name or limit.name, trials=trials, pin=pin, grid=grid, batch=limit.batch,
            optimizer=limit.fixed_optimizer, baseline_label=limit.baseline,
            max_slowdown=limit.max_slowdown, workload=limit.workload,
        )  # fmt: skip
    elif not args.name:
        raise SystemExit("record: give --name or --limit")
    else:
        row = record(
            name=args.name, trials=trials, pin=pin, grid=grid, batch=args.batch,
            optimizer=args.optimizer,
        )  # fmt: skip
    _append(args.out, row)
    print(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    script_main(main)
