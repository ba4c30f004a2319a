"""benchmarks/tuner.py: issue 10's limits, the grid best and the per-limit record; and
benchmarks/versus.py, one limit's pins head to head."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 22, 3, 0, 0)


def _tuner():
    return importlib.import_module("benchmarks.tuner")


def _limits():
    return importlib.import_module("benchmarks.limits")


def _grid(label: str, gb: float, ms: float, **spec: Any) -> dict[str, Any]:
    batch = spec.pop("batch", None)
    return {
        "label": label,
        "options": {} if batch is None else {"batch_size": batch},
        "spec": {"optimizer_impl": "as_written", **spec},
        "result": {
            "measurement": {
                "peak_device_bytes": gb * 1e9,
                "peak_allocated_bytes": gb * 1e9 - 1e9,
                "step_time_ms": ms,
                "peak_phase": "backward",
            }
        },
    }


GRID = [
    _grid("budget-1.0", 19.03, 77.0),
    _grid("budget-0.5", 16.50, 80.0),
    _grid("ac-every-1", 15.06, 89.2),
    _grid("fused-ac-every-1", 14.16, 78.8, optimizer_impl="fused"),
    _grid("fused-budget-0.7", 15.60, 67.8, optimizer_impl="fused"),
    _grid("fused-budget-0.5", 15.20, 70.0, optimizer_impl="fused"),
    _grid("fused-budget-1.0", 17.50, 66.0, optimizer_impl="fused"),
    _grid("b8-fused-budget-1.0", 25.0, 140.0, optimizer_impl="fused", batch=8),
    _grid("b8-fused-ac-every-1", 19.94, 142.6, optimizer_impl="fused", batch=8),
    _grid("b64-ac-every-1", 81.0, 1142.0, batch=64),
    {"label": "oom", "options": {}, "spec": {}, "result": {"measurement": None}},
]


def test_limits_come_from_the_grid_peaks() -> None:
    limits = _tuner().limits(GRID)
    assert limits["L1"].gb == pytest.approx(16.50)
    assert limits["L2"].gb == pytest.approx(1.02 * 14.16)
    assert (limits["L3"].gb, limits["L3"].batch, limits["L3"].fixed_optimizer) == (
        pytest.approx(1.10 * 19.94),
        8,
        None,
    )
    assert (limits["L4"].gb, limits["L4"].fixed_optimizer) == (pytest.approx(15.20), "fused")
    assert (limits["L5"].gb, limits["L5"].batch, limits["L5"].fixed_optimizer) == (120.0, 64, None)
    # each target is stated against its own baseline
    assert [(limits[n].baseline, limits[n].max_slowdown) for n in sorted(limits)] == [
        ("budget-1.0", -0.12),
        ("budget-1.0", 0.02),
        ("b8-budget-1.0", 0.03),
        ("fused-budget-1.0", 0.02),
        ("b64-ac-every-1", -0.10),
    ]
    assert _tuner().limits(GRID[:1]) == {}  # each waits for its grid point


def test_grid_best_respects_limit_batch_and_optimizer() -> None:
    best = _tuner().grid_best
    assert best(GRID, 16.5e9)["label"] == "fused-budget-0.7"
    assert best(GRID, 16.5e9, optimizer="as_written")["label"] == "budget-0.5"
    assert best(GRID, 15.3e9, optimizer="fused")["label"] == "fused-budget-0.5"
    assert best(GRID, 30e9, batch=8)["label"] == "b8-fused-budget-1.0"
    assert best(GRID, 21e9, batch=8)["label"] == "b8-fused-ac-every-1"
    assert best(GRID, 10e9) is None
    vit = {**GRID[1], "label": "vit-budget-1.0", "workload": "builtin:vit"}
    assert best([vit], 20e9) is None and best([vit], 20e9, workload="builtin:vit") == vit


def _trial(number: int, start: float, end: float, ms: float, feasible: bool = True):
    trial = create_trial(
        state=TrialState.COMPLETE,
        value=ms,
        params={"x": 0.5},
        distributions={"x": FloatDistribution(0, 1)},
        user_attrs={
            "outcome": "ok",
            "step_time_ms": ms,
            "constraint": [-1.0 if feasible else 1.0],
        },
    )
    trial.number = number
    trial.datetime_start = T0 + timedelta(seconds=start)
    trial.datetime_complete = T0 + timedelta(seconds=end)
    return trial


def test_first_within_counts_finished_trials_until_a_feasible_one_is_close() -> None:
    trials = [
        _trial(0, 0, 40, 66.0, feasible=False),  # fast but over the limit: does not count
        _trial(1, 40, 85, 80.0),
        _trial(2, 85, 130, 69.0),  # within 2 % of 67.8
        _trial(3, 130, 170, 67.0),
    ]
    assert _tuner().first_within(trials, 67.8) == (3, 130.0)
    assert _tuner().first_within(trials[:2], 67.8) is None


def _pin(gb: float, ms: float, limit_gb: float = 16.5, study: str = "tuner-L1") -> dict[str, Any]:
    """A pinned config as `budgettune search` writes it (what `record` reads)."""
    return {
        "limit_bytes": limit_gb * 1e9,
        "mem_metric": "device",
        "study_name": study,
        "created_at": (T0 + timedelta(seconds=300)).isoformat() + "+00:00",
        "spec": {"activation_memory_budget": 0.7, "optimizer_impl": "fused"},
        "measured": {
            "peak_worst_bytes": gb * 1e9,
            "peak_phase": "backward",
            "step_time_ms": ms,
            "runs": 5,
        },
        "fingerprint": {"device_name": "NVIDIA H200", "torch_version": "2.11.0+cu130"},
    }


def test_record_of_a_search() -> None:
    pin = _pin(15.61, 68.0)
    trials = [_trial(0, 0, 40, 77.0), _trial(1, 40, 90, 68.5)]
    row = _tuner().record(name="L1", trials=trials, pin=pin, grid=GRID, max_slowdown=-0.10, gpus=4)
    assert row["grid_best"]["label"] == "fused-budget-0.7" and row["gpus"] == 4
    assert row["baseline"]["label"] == "budget-1.0"
    assert row["vs_baseline"] == pytest.approx(68.0 / 77.0 - 1)
    assert row["target_met"] is True  # 11.7 % faster, under the limit
    l4 = _tuner().record(
        name="L4", trials=trials, pin=pin, grid=GRID, optimizer="fused",
        baseline_label="fused-budget-1.0", max_slowdown=0.02,
    )  # fmt: skip
    assert l4["baseline"]["label"] == "fused-budget-1.0"
    assert l4["vs_baseline"] == pytest.approx(68.0 / 66.0 - 1) and l4["target_met"] is False
    assert row["vs_grid_best"] == pytest.approx(68.0 / 67.8 - 1)
    assert row["within_2pct"] == {"trials": 2, "wall_s": 90.0}
    assert row["total_wall_s"] == 300.0
    assert row["pin"]["config"].startswith("budget 0.70") and row["pin"]["runs"] == 5
    # the README renders it
    report = importlib.import_module("benchmarks.report")
    row["date"] = pin["created_at"]
    text = report.tuner_table([row])
    assert "| L1 | 16.50 | budget 0.70" in text
    assert (
        "| 15.61 (5) | 68.0 | -11.7% vs budget-1.0 | <= -10%: met | "
        "fused-budget-0.7 (15.60 GB, 67.8 ms) | +0.3% |"
    ) in text
    assert "| 2 trials, 90 s | 300 s | 4 | 2 |" in text
    # with the search's own re-measured baseline, the target is judged on that one
    own = {**pin, "baseline": {"slowdown": -0.125, "runs": 5}}
    strict = _tuner().record(name="L1", trials=trials, pin=own, grid=GRID, max_slowdown=-0.12)
    assert strict["vs_study_baseline"] == -0.125 and strict["target_met"] is True
    assert strict["vs_baseline"] == pytest.approx(68.0 / 77.0 - 1)  # -11.7 %: the grid's
    strict["date"], strict["active_wall_s"] = pin["created_at"], 250.0
    text = report.tuner_table([strict])
    assert "| -12.5% (5 runs in the study); grid: -11.7% vs budget-1.0 | <= -12%: met |" in text
    assert "| 300 s (250 s running) | - |" in text  # GPUs not known
    # L5's baseline is full block AC: its own re-measurement is the pin's full_ac
    l5 = {**pin, "baseline": None, "full_ac": {"slowdown": -0.2, "runs": 5}}
    row5 = _tuner().record(
        name="L5", trials=trials, pin=l5, grid=GRID, baseline_label="b64-ac-every-1",
        max_slowdown=-0.10,
    )  # fmt: skip
    assert row5["vs_study_baseline"] == -0.2 and row5["target_met"] is True


def test_search_command_sets_batch_for_l3_and_fixes_the_optimizer_for_l4() -> None:
    tuner = _tuner()
    known = tuner.limits(GRID)
    command = tuner.search_command(
        known["L3"], storage="s.db", pin=Path("p.json"), trials=20, reverify=5
    )
    joined = " ".join(command[1:])
    # the limits with their own headroom are searched without the study file's 2 % margin,
    # in a study of their own (the 2 % searches of 2026-11-25 keep theirs)
    assert "--max-mem 21.934GB" in joined and "--study tuner-L3-m0-edge2 --margin 0 " in joined
    assert "-o batch_size=8" in joined and "--fix" not in joined
    assert "--trials 20" in joined and "--reverify 5" in joined
    l4 = " ".join(
        tuner.search_command(
            known["L4"], storage="s.db", pin=Path("p.json"), trials=20, reverify=5
        )
    )
    assert "--fix optimizer_impl=fused" in l4 and "batch_size" not in l4
    # a limit searched again gets a study and a pin of its own; the first study stays
    assert "--study tuner-L4-m0-lean " in l4
    assert (tuner.study_name("L5"), tuner.pin_file("L5")) == (
        "tuner-L5-m0-lean",
        "tuner-L5-lean-pin.json",
    )
    l1 = " ".join(
        tuner.search_command(
            known["L1"], storage="s.db", pin=Path("p.json"), trials=20, reverify=5
        )  # fmt: skip
    )
    assert "--study tuner-L1-open30 --margin 0.02 " in l1
    assert tuner.pin_file("L1") == "tuner-L1-open30-pin.json"


def test_a_seeded_repeat_of_a_limit_gets_its_own_study_pin_seed_and_record_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuner, lim = _tuner(), _limits()
    assert lim.split_run("L3") == ("L3", None) and lim.split_run("L3-s12") == ("L3", 12)
    for bad in ("L7", "L3-s", "L3-sx", "l3", "L3-r1"):
        with pytest.raises(ValueError, match="is not a limit"):
            lim.split_run(bad)
    # the first search's study and pin stay; the repeat's are apart from both
    assert tuner.study_name("L3-s1") == "tuner-L3-m0-edge2-s1"
    assert tuner.pin_file("L3-s1") == "tuner-L3-edge2-s1-pin.json"
    assert tuner.study_name("L2-s0") == "tuner-L2-m0-s0" != tuner.study_name("L2")
    known = tuner.limits(GRID)
    kwargs = {"storage": "s.db", "pin": Path("p.json"), "trials": 20, "reverify": 5}
    seeded = tuner.search_command(known["L3"], seed=1, **kwargs)
    assert seeded[seeded.index("--study") + 1] == "tuner-L3-m0-edge2-s1"
    assert seeded[-2:] == ["--seed", "1"]
    assert "--seed" not in tuner.search_command(known["L3"], **kwargs)  # drawn at random

    # `tuner run L3-s1`: that search, its pin file, its study's trials, a record named for it
    calls: list[list[str]] = []

    def fake_call(command: list[str]) -> int:
        calls.append(command)
        (tmp_path / "tuner-L3-edge2-s1-pin.json").write_text(
            json.dumps(_pin(21.0, 120.0, limit_gb=21.93, study="tuner-L3-m0-edge2-s1"))
        )
        return 0

    asked: list[str] = []
    monkeypatch.setattr(tuner.subprocess, "call", fake_call)
    monkeypatch.setattr(
        tuner, "study_trials", lambda url, names: asked.extend(names) or {names[0]: []}
    )
    grid_file = tmp_path / "grid.jsonl"
    grid_file.write_text("".join(json.dumps(r) + "\n" for r in GRID))
    out = tmp_path / "records.jsonl"
    argv = ["run", "L3-s1", "--grid", str(grid_file), "--storage", "sqlite:///x.db"]
    argv += ["--out", str(out), "--pins", str(tmp_path)]
    assert tuner.main(argv) == 0
    assert calls[0][-2:] == ["--seed", "1"] and asked == ["tuner-L3-m0-edge2-s1"]
    assert json.loads(out.read_text())["name"] == "L3, sampler seed 1"
    with pytest.raises(SystemExit) as bad:  # a bad token: argparse's one-line usage error
        tuner.main(["run", "L3-x", *argv[2:]])
    assert bad.value.code == 2 and len(calls) == 1


def test_limits_table_says_whether_the_grid_meets_each_target() -> None:
    text = _limits().limits_table(GRID)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()[4:]}
    # L1 16.50 GB: fused-budget-0.7 at 67.8 ms against budget-1.0's 77.0 is -11.9 %
    assert "fused-budget-0.7 (15.60 GB, 67.8 ms) | -11.9% | <= -12% | no |" in rows["L1"]
    # L3: no B=8 baseline as written in this grid
    assert "| not measured |" in rows["L3"] and rows["L3"].endswith("| - |")
    # L4: only fused configurations count; 70.0 vs 66.0 ms is +6.1 %
    assert "fused-budget-0.5 (15.20 GB, 70.0 ms) | +6.1% | <= +2% | no |" in rows["L4"]
    grid = [*GRID, _grid("fused-budget-0.6", 15.20, 67.0, optimizer_impl="fused")]
    assert _limits().limits_table(grid).splitlines()[7].endswith("| +1.5% | <= +2% | yes |")
    assert _limits().limits_table(GRID[:1]) == ""


VIT = [
    {**_grid("vit-budget-1.0", 5.66, 20.5), "workload": "builtin:vit"},
    {**_grid("vit-budget-0.7", 4.79, 21.3), "workload": "builtin:vit"},
    {**_grid("vit-op-sac", 2.73, 26.3), "workload": "builtin:vit"},
    {**_grid("vit-ac-every-1", 2.39, 27.4), "workload": "builtin:vit"},
]


def test_the_vit_limit_lies_midway_and_is_searched_on_vit_at_its_own_batch() -> None:
    tuner = _tuner()
    v = tuner.limits(GRID + VIT)["V"]
    assert v.gb == pytest.approx((2.39 + 5.66) / 2) and v.max_slowdown is None
    assert "V" not in tuner.limits(GRID)  # no ViT points, no ViT limit
    # its grid best is a ViT point, never a Llama one under the same GB
    best = tuner.grid_best(GRID + VIT, v.gb * 1e9, batch=v.batch, workload=v.workload)
    assert best["label"] == "vit-op-sac"
    joined = " ".join(
        tuner.search_command(v, storage="s.db", pin=Path("p.json"), trials=20, reverify=5)
    )
    assert "--workload builtin:vit" in joined and "batch_size" not in joined  # 64, its own
    assert "--study tuner-V-m0 --margin 0 " in joined
    table = _limits().limits_table(GRID + VIT)
    row = next(line for line in table.splitlines() if line.startswith("| V |"))
    assert "vit-op-sac (2.73 GB, 26.3 ms) | +28.3% | - | - |" in row


def test_wall_record_splits_trials_and_reverification_and_the_readme_renders_it() -> None:
    pin = {
        "study_name": "wall-1gpu-20261126T0900",
        "limit_bytes": 17.5e9,
        "created_at": (T0 + timedelta(seconds=1000)).isoformat() + "+00:00",
        "fingerprint": {"device_name": "NVIDIA H200", "torch_version": "2.11.0+cu130"},
    }
    trials = [_trial(0, 0, 40, 77.0), _trial(1, 40, 800, 68.5)]
    row = _tuner().wall_record(name="llama-1b", trials=trials, pin=pin, fresh_runs=12, gpus=1)
    assert (row["trials_wall_s"], row["reverify_wall_s"], row["total_wall_s"]) == (800, 200, 1000)
    assert row["target_s"] == 1200 and row["target_met"] is True
    four = _tuner().wall_record(name="llama-1b", trials=trials, pin=pin, fresh_runs=12, gpus=4)
    assert four["target_s"] == 360 and four["target_met"] is False
    two = _tuner().wall_record(name="llama-1b", trials=trials, pin=pin, fresh_runs=12, gpus=2)
    assert two["target_met"] is None  # the issue names no 2-GPU target
    report = importlib.import_module("benchmarks.report")
    text = report.wall_table([row, four])
    assert "| 1 | 2 | 800 s | 12 | 200 s | 1000 s (16.7 min) | <= 20 min: met |" in text
    assert "| <= 6 min: missed |" in text
    # the whole command (start-up checks in) is what the target is judged on, when known
    slow = _tuner().wall_record(
        name="llama-1b", trials=trials, pin=pin, fresh_runs=12, gpus=1, command_wall_s=1260
    )
    assert slow["total_wall_s"] == 1000 and slow["target_met"] is False
    assert "1000 s (16.7 min); the command 1260 s (21.0 min) | <= 20 min: missed |" in (
        report.wall_table([slow])
    )
    # a command time taken from elsewhere (the search's own timer) says so in its cell
    noted = {**slow, "command_wall_note": "budgettune search's own timer"}
    assert "the command 1260 s (21.0 min, budgettune search's own timer) |" in (
        report.wall_table([noted])
    )


def test_versus_times_two_searches_pins_beside_the_grids_fastest_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import reference, versus

    tuner = _tuner()
    grid = [
        *GRID,
        _grid("b8-fused-budget-0.3", 20.9, 134.7, optimizer_impl="fused", batch=8),
        _grid("b8-budget-0.5", 21.5, 141.0, batch=8),
        _grid("b8-fused-budget-0.3", 20.9, 150.0, optimizer_impl="fused", batch=8),  # again
    ]
    limit = tuner.limits(grid)["L3"]  # 1.10 x 19.94 = 21.93 GB at B=8

    def pin(study: str, budget: float, batch: int = 8) -> dict[str, Any]:
        spec = {"activation_memory_budget": budget, "block_ac_every": 4, "timed_steps": 8}
        return {
            "study_name": study,
            "workload": "builtin:llama",
            "workload_options": {"batch_size": batch},
            "spec": spec,
        }

    pins = [pin("tuner-L3-m0", 0.63), pin("tuner-L3-m0-open30", 0.55)]
    candidates = versus.versus_configs(limit, grid, pins)
    # the grid's three fastest under 21.93 GB at B=8 (each label once, its fastest), the pins
    assert [c["label"] for c in candidates] == [
        "b8-fused-budget-0.3",
        "b8-budget-0.5",
        "b8-fused-ac-every-1",
        "pin-tuner-L3-m0",
        "pin-tuner-L3-m0-open30",
    ]
    assert {c["spec"]["timed_steps"] for c in candidates} == {20}
    assert candidates[4]["options"] == {"batch_size": 8}
    assert candidates[4]["spec"]["activation_memory_budget"] == 0.55
    with pytest.raises(SystemExit, match="batch 4, not builtin:llama batch 8"):
        versus.versus_configs(limit, grid, [pin("tuner-L1", 0.86, batch=4)])

    # measured round by round on one GPU; the report holds each pin against the grid's best
    times = {
        "pin-tuner-L3-m0": 126.0,
        "pin-tuner-L3-m0-open30": 129.0,
        "b8-fused-budget-0.3": 134.0,
    }
    calls: list[str] = []

    def measure(config: dict, *, device: str, args: object) -> dict:
        calls.append(device)
        m = {"peak_device_bytes": 21e9, "peak_allocated_bytes": 20e9, "peak_phase": "backward"}
        m |= {"step_time_ms": times.get(config["label"], 140.0), "compile_s": 30.0}
        result = {"measurement": m, "outcome": "ok", "wall_s": 60.0}
        return {**config, "result": result, "device_index": device}

    monkeypatch.setattr(reference, "measure", measure)
    paths = []
    for p in pins:
        paths.append(tmp_path / f"{p['study_name']}-pin.json")
        paths[-1].write_text(json.dumps(p))
    (tmp_path / "grid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in grid))
    out = tmp_path / "versus.jsonl"
    argv = ["L3", "--grid", str(tmp_path / "grid.jsonl"), "--pins", *map(str, paths)]
    argv += ["--out", str(out), "--gpus", "2", "--rounds", "2"]
    assert versus.main(argv) == 0
    assert len(calls) == 2 * 5 and set(calls) == {"cuda:2"}
    assert versus.main(argv) == 0 and len(calls) == 2 * 5  # resumed: nothing left
    from benchmarks.grid30_final import final_report

    table = final_report([json.loads(line) for line in out.read_text().splitlines()])
    assert (
        "| L3 | pin-tuner-L3-m0 | 2 | 126.0 | 21.00 / 21.93 | b8-fused-budget-0.3 | 134.0 |"
        in table
    )
    assert "| L3 | pin-tuner-L3-m0-open30 | 2 | 129.0 |" in table and "-3.7%" in table
    # a pin file that is not there: one line, nothing measured
    with pytest.raises(SystemExit, match="no pin file"):
        versus.main([*argv[:4], str(tmp_path / "missing.json"), *argv[5:]])
    assert len(calls) == 2 * 5
