"""Issue 30's benchmark script: the grid it measures, the limit it sets, the grid best a pin is
held to (same margin), and the row it records; the GPU runs themselves are in
benchmarks/results/."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from benchmarks import grid30_final as final
from benchmarks import grid_vs_search as g30
from benchmarks import reference


def _record(label: str, peak_gb: float, ms: float) -> dict:
    return {
        "label": label,
        "result": {"measurement": {"peak_device_bytes": int(peak_gb * 1e9), "step_time_ms": ms}},
    }


def test_the_grid_holds_twelve_structured_points_and_a_few_budgets_per_workload() -> None:
    for name in g30.WORKLOADS:
        configs = g30.grid_configs(name)
        labels = [c["label"] for c in configs]
        assert len(labels) == len(set(labels)) == 19
        structured = [c for c in configs if c["spec"].get("block_ac_every")]
        assert len(structured) >= 12
        assert {c["workload"] for c in configs} == {g30.WORKLOADS[name][0]}
        # reachable through benchmarks/reference.py, which measures and resumes it
        assert reference.configs(f"grid30-{name}", warmup=2, timed=8) == configs
    with pytest.raises(SystemExit, match="grid30- sets"):
        reference.configs("grid30-nope", warmup=2, timed=8)


def test_the_limit_lies_halfway_and_the_grid_best_fits_it_with_the_margin() -> None:
    grid = [
        _record("gpt2m-budget-1.0", 13.94, 51.8),
        _record("gpt2m-full-ac-every-1", 6.39, 63.9),
        _record("gpt2m-fused-full-ac-every-2", 9.01, 56.7),
        _record("gpt2m-lean-op-ac-every-2", 10.53, 56.3),  # over the limit with the margin
        _record("vit-budget-1.0", 1.0, 10.0),  # another workload: never gpt2m's best
    ]
    limit = g30.limit_bytes(grid, "gpt2m")
    assert limit == int((13.94e9 + 6.39e9) / 2)
    assert g30.limit_bytes(grid[2:], "gpt2m") is None
    best = g30.grid_best(grid, "gpt2m", limit)
    assert best is not None and best["label"] == "gpt2m-fused-full-ac-every-2"
    pin = {
        "spec": {"activation_memory_budget": 0.48, "block_ac_every": 1, "block_ac_policy": "op"},
        "measured": {"step_time_ms": 60.1, "peak_worst_bytes": 6_690_000_000},
        "trials": 12,
    }
    row = g30.record("gpt2m", seed=1, limit=limit, pin=pin, grid=grid)
    assert row["vs_grid_best"] == pytest.approx(60.1 / 56.7 - 1)
    table = g30.report([row])
    assert "| gpt2m | tpe | 1 | 10.16 |" in table and "+6.0%" in table
    gp = g30.record("gpt2m", seed=1, limit=limit, pin=pin, grid=grid, sampler="gp")
    assert "| gpt2m | gp | 1 |" in g30.report([gp])
    assert g30.study_of("gpt2m", 1, "gp") == "grid30-gpt2m-s1-gp"
    assert "--sampler gp" in " ".join(g30.search_command(
        "gpt2m", limit=limit, seed=1, storage="s", pin=Path("p"), gpus="", sampler="gp"
    ))  # fmt: skip


def test_the_search_command_is_the_readmes_with_the_seed_and_twelve_trials(tmp_path: Path) -> None:
    command = g30.search_command(
        "llama1b", limit=25_000_000_000, seed=2, storage="sqlite:///s.db",
        pin=tmp_path / "p.json", gpus="0",
    )  # fmt: skip
    text = " ".join(command)
    assert "--max-mem 25.000GB --trials 12 --seed 2 --study grid30-llama1b-s2" in text
    assert "-o tie_word_embeddings=true" in text and text.endswith("--gpus 0")
    # a study cut off: its worker runs it to the target set first, the search only pins
    resumed = " ".join(g30.search_command(
        "llama1b", limit=25_000_000_000, seed=2, storage="sqlite:///s.db",
        pin=tmp_path / "p.json", gpus="0", trials=0,
    ))  # fmt: skip
    assert "--trials 0 --seed 2" in resumed
    worker = g30.resume_command("llama1b", seed=2, storage="sqlite:///s.db")
    assert worker[2:] == [
        "budgettune.cli", "worker", "--study", "grid30-llama1b-s2", "--storage",
        "sqlite:///s.db", "--device", "cuda:0",
    ]  # fmt: skip
    assert not g30._study_exists(f"sqlite:///{tmp_path}/none.db")
    (tmp_path / "s.db").touch()
    assert g30._study_exists(f"sqlite:///{tmp_path}/s.db")


def test_workers_on_other_gpus_share_the_grid_and_the_seeds_by_claims(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    assert reference.claim(claims, "gpt2m-budget-1.0")
    assert not reference.claim(claims, "gpt2m-budget-1.0")  # a second worker skips it
    assert reference.claim(claims, "search-gpt2m-s0")


def test_a_search_waits_for_the_points_other_workers_still_measure(tmp_path: Path) -> None:
    grid = tmp_path / "grid.jsonl"
    rows = [_record("gpt2m-budget-1.0", 13.94, 51.8), _record("gpt2m-full-ac-every-1", 6.4, 64)]
    grid.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the limit's two points are there: no wait for the start of a search
    assert len(g30._await_grid([grid], "gpt2m", wait_s=60.0, full=False)) == 2
    # the full grid is not: after its wait, what is there (here no wait at all)
    assert len(g30._await_grid([grid], "gpt2m", wait_s=0.0, full=True)) == 2
    labels = [c["label"] for c in g30.grid_configs("gpt2m")]
    rest = [
        _record(label, 9.0, 55.0) for label in labels if label not in {r["label"] for r in rows}
    ]
    grid.write_text(grid.read_text() + "".join(json.dumps(r) + "\n" for r in rest))
    assert len(g30._await_grid([grid], "gpt2m", wait_s=60.0, full=True)) == 19


def _grid_point(label: str, peak_gb: float, ms: float) -> dict:
    config = next(c for c in g30.grid_configs("gpt2m") if c["label"] == label)
    return {**config, **_record(label, peak_gb, ms)}


def test_the_head_to_head_meets_the_grids_fastest_fitting_points_and_every_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = [
        _grid_point("gpt2m-budget-1.0", 13.94, 51.8),  # over the limit
        _grid_point("gpt2m-full-ac-every-1", 6.39, 63.9),
        _grid_point("gpt2m-fused-full-ac-every-2", 9.01, 56.7),
        _grid_point("gpt2m-op-ac-every-1", 6.73, 57.8),
        _grid_point("gpt2m-full-ac-every-2", 9.24, 59.6),
    ]
    pin = {"activation_memory_budget": 0.48, "block_ac_every": 1, "timed_steps": 5}
    records = [
        {"workload": "gpt2m", "seed": 0, "pin_spec": pin},
        {"workload": "gpt2m", "seed": 1, "sampler": "gp", "pin_spec": pin},
        {"workload": "vit", "seed": 0, "pin_spec": pin},  # another workload's
    ]
    candidates = final.final_configs("gpt2m", grid, records)
    assert [c["label"] for c in candidates] == [
        "gpt2m-fused-full-ac-every-2", "gpt2m-op-ac-every-1", "gpt2m-full-ac-every-2",
        "pin-grid30-gpt2m-s0", "pin-grid30-gpt2m-s1-gp",
    ]  # fmt: skip
    # all timed alike, whatever steps the grid or the search used
    assert {c["spec"]["timed_steps"] for c in candidates} == {final.FINAL_STEPS["timed_steps"]}
    assert candidates[3]["spec"]["activation_memory_budget"] == 0.48
    assert candidates[3]["workload"] == "hf:gpt2" and candidates[3]["options"]["n_layer"] == 24
    # every round starts with another candidate
    firsts = [final.final_order(candidates, r)[0]["label"] for r in range(len(candidates))]
    assert len(set(firsts)) == len(candidates)
    assert sorted(c["label"] for c in final.final_order(candidates, 7)) == sorted(
        c["label"] for c in candidates
    )

    # `final` measures every candidate each round, appends, and resumes where it stopped
    times = {"gpt2m-fused-full-ac-every-2": [58.0, 57.0, 90.0], "pin-grid30-gpt2m-s0": [57.5] * 3}
    calls: list[tuple[str, str]] = []

    def measure(config: dict, *, device: str, args: object) -> dict:
        calls.append((config["label"], device))
        ms = times.get(config["label"], [70.0] * 3)[
            (sum(c[0] == config["label"] for c in calls) - 1) % 3
        ]
        peak = 11e9 if config["label"].endswith("-gp") else 9e9
        measurement = {"peak_device_bytes": int(peak), "peak_allocated_bytes": int(peak * 0.9)}
        measurement |= {"step_time_ms": ms, "peak_phase": "backward", "compile_s": 20.0}
        result = {"measurement": measurement, "outcome": "ok", "wall_s": 30.0}
        return {**config, "result": result, "device_index": device}

    monkeypatch.setattr(reference, "measure", measure)
    paths = [tmp_path / n for n in ("grid.jsonl", "records.jsonl")]
    for path, rows in zip(paths, (grid, records), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "final.jsonl"
    argv = ["measure", "gpt2m", "--grid", str(paths[0]), "--records", str(paths[1])]
    argv += ["--out", str(out), "--gpus", "3", "--rounds", "2"]
    assert final.main(argv) == 0
    assert len(calls) == 2 * 5 and {d for _, d in calls} == {"cuda:3"}
    assert final.main([*argv[:-1], "3"]) == 0  # a third round: only it is measured
    assert len(calls) == 3 * 5
    rows = {r["pin"]: r for r in final.final_rows(g30.read_jsonl([out]))}
    s0, gp = rows["pin-grid30-gpt2m-s0"], rows["pin-grid30-gpt2m-s1-gp"]
    # medians: the grid point's 90 ms round does not count against it
    assert s0["grid_best"] == "gpt2m-fused-full-ac-every-2" and s0["grid_best_ms"] == 58.0
    assert s0["rounds"] == 3 and s0["vs_grid_best"] == pytest.approx(57.5 / 58.0 - 1)
    assert s0["fits"] and not gp["fits"]  # 11 GB against a 10.16 GB limit
    table = final.final_report(g30.read_jsonl([out]))
    assert "| gpt2m | pin-grid30-gpt2m-s0 | 3 | 57.5 | 9.00 / 10.16 |" in table
    assert "11.00 / 10.16 (over)" in table and "-0.9%" in table and "+20.7%" in table
    # no pin recorded yet: nothing to hold the grid against
    (tmp_path / "none.jsonl").write_text("")
    assert final.main([*argv[:5], str(tmp_path / "none.jsonl"), *argv[6:]]) == 2
    # no grid yet (a wrong path): one line naming it, and nothing measured
    assert final.main([*argv[:3], str(tmp_path / "nogrid.jsonl"), *argv[4:]]) == 2
    assert len(calls) == 3 * 5
    # a worker free early waits for every seed's pin: exit 3, nothing claimed, nothing measured
    claims = tmp_path / "claims"
    early = ["measure", "gpt2m", "--grid", str(paths[0]), "--records", str(paths[1])]
    early += ["--out", str(tmp_path / "early.jsonl"), "--claims", str(claims), "--rounds", "1"]
    assert final.main([*early, "--wait-for", "grid30-gpt2m-s0", "grid30-gpt2m-s2"]) == 3
    assert len(calls) == 3 * 5 and not list(claims.glob("*"))
    assert final.main([*early, "--wait-for", "grid30-gpt2m-s0", "grid30-gpt2m-s1-gp"]) == 0
    assert len(calls) == 3 * 5 + 5 and [p.name for p in claims.iterdir()] == ["final-gpt2m-r0"]
    # workers on other GPUs take a round each: round 1 held by another, this one measures round 2
    assert reference.claim(claims, "final-gpt2m-r1")
    assert final.main([*early[:-1], "3"]) == 0
    assert len(calls) == 3 * 5 + 2 * 5 and calls[-1][1] == "cuda"
    assert {r["round"] for r in g30.read_jsonl([tmp_path / "early.jsonl"])} == {0, 2}


def test_each_gpu_worker_gets_its_own_share_of_the_cpus() -> None:
    from benchmarks import cpu_share

    cpus = list(range(64))
    parts = [cpu_share.share(cpus, i, 4) for i in range(4)]
    assert parts[0] == list(range(16)) and parts[3] == list(range(48, 64))
    assert set().union(*parts) == set(cpus)  # disjoint and complete
    # a cpuset that is not 0..N-1, and more workers than CPUs
    assert cpu_share.share([3, 1, 7, 5, 9], 1, 2) == [5, 7]
    assert cpu_share.share([2], 1, 2) == [2]
    with pytest.raises(ValueError, match="not one of 2"):
        cpu_share.share(cpus, 2, 2)
    # on a real process: its affinity becomes that share (and its later children inherit it)
    import os
    import subprocess

    child = subprocess.Popen(["sleep", "30"])
    try:
        allowed = os.sched_getaffinity(child.pid)
        assert cpu_share.main([str(child.pid), "0", "2"]) == 0
        assert os.sched_getaffinity(child.pid) == set(cpu_share.share(allowed, 0, 2))
        with pytest.raises(SystemExit) as bad:  # one line, exit 2, the affinity untouched
            cpu_share.main([str(child.pid), "2", "2"])
        assert bad.value.code == 2
        assert os.sched_getaffinity(child.pid) == set(cpu_share.share(allowed, 0, 2))
    finally:
        child.kill()
        child.wait()


def test_the_contention_check_times_one_point_alone_beside_compiles_and_on_cpu_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from benchmarks import contention

    config = contention.subject_config("gpt2m-full-ac-every-2")
    assert config["spec"]["block_ac_every"] == 2 and config["spec"]["timed_steps"] == 20
    with pytest.raises(SystemExit, match="no grid30 configuration"):
        contention.subject_config("gpt2m-nope")
    command = contention.neighbour_command(3, tmp_path / "n.jsonl", tmp_path / "runs")
    assert command[1:5] == ["-m", "benchmarks.reference", "--set", "grid30-llama1b"]
    assert "--cache" not in command and command[command.index("--gpus") + 1] == "3"

    # the phases, with a sleeping neighbour in place of the compiling grid
    seen: list[tuple[str, int, list[set[int]]]] = []
    neighbours: list[int] = []

    def sleeper(gpu: int, out: Path, runs_dir: Path) -> list[str]:
        return ["sleep", "60"]

    def measure(config: dict, *, device: str, args: object) -> dict:
        pids = [int(p) for p in neighbours]
        seen.append(
            (device, len(os.sched_getaffinity(0)), [os.sched_getaffinity(p) for p in pids])
        )
        m = {"step_time_ms": 60.0 + len(seen), "peak_device_bytes": 9, "peak_allocated_bytes": 8}
        m |= {"peak_phase": "backward", "compile_s": 1.0}
        return {**config, "result": {"measurement": m, "outcome": "ok", "wall_s": 1.0},
                "device_index": device}  # fmt: skip

    started = contention._start_neighbours

    def start(gpus, work, *, cpus):  # type: ignore[no-untyped-def]
        processes = started(gpus, work, cpus=cpus)
        neighbours[:] = [p.pid for p in processes]
        return processes

    monkeypatch.setattr(contention, "neighbour_command", sleeper)
    monkeypatch.setattr(contention, "_start_neighbours", start)
    monkeypatch.setattr(contention, "SETTLE_S", 0.0)
    monkeypatch.setattr(reference, "measure", measure)
    allowed = os.sched_getaffinity(0)
    out = tmp_path / "c.jsonl"
    argv = ["--out", str(out), "--gpu", "2", "--neighbours", "5", "--repeats", "2"]
    assert contention.main([*argv, "--work", str(tmp_path / "w")]) == 0
    records = g30.read_jsonl([out])
    assert [r["phase"] for r in records] == ["alone"] * 2 + ["busy"] * 2 + ["shares"] * 2
    assert {d for d, _, _ in seen} == {"cuda:2"}
    half = cpu_share_of(allowed)
    # alone and busy: all CPUs; shares: the subject on share 0, the neighbour on share 1
    assert [n for _, n, _ in seen[1:5]] == [len(allowed)] * 4
    assert [n for _, n, _ in seen[5:]] == [len(half[0])] * 2
    assert seen[5][2] == [set(half[1])]
    assert os.sched_getaffinity(0) == allowed  # given back
    assert all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in neighbours)
    assert "alone   n=2 median 62.5 ms (min 62.0, max 63.0)" in contention.summary(records)


def cpu_share_of(allowed: set[int]) -> list[list[int]]:
    from benchmarks import cpu_share

    return [cpu_share.share(allowed, i, 2) for i in range(2)]


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1].startswith("Z")


def test_the_opening_table_counts_the_openings_trials_the_samplers_and_names_the_pins_source() -> (
    None
):
    def trial(number: int, label: str | None, finished: bool = True) -> optuna.trial.FrozenTrial:
        attrs = {"outcome": "ok"} if finished else {}
        attrs |= {"baseline": label} if label else {}
        state = optuna.trial.TrialState.COMPLETE if finished else optuna.trial.TrialState.FAIL
        made = optuna.trial.create_trial(state=state, value=1.0 if finished else None)
        made.number, made.user_attrs = number, attrs
        return made

    trials = [trial(0, "unconstrained"), trial(1, "structured-op-1"), trial(2, None, False)]
    trials += [trial(3, None), trial(4, "flip-optimizer_impl")]
    table = g30.opening_table(
        {"grid30-gpt2m-s0": trials, "grid30-vit-s0": trials[:2]},
        {"grid30-gpt2m-s0": {"trial_number": 1}},
    )
    rows = table.splitlines()[2:]
    assert rows[0] == (
        "| grid30-gpt2m-s0 | 3 | 1 | 1 | unconstrained, structured-op-1, flip-optimizer_impl "
        "| trial 1 (structured-op-1) |"
    )
    assert rows[1].endswith("| 2 | 0 | 0 | unconstrained, structured-op-1 | - |")
    table = g30.opening_table({"s": trials}, {"s": {"trial_number": 3}})
    assert table.endswith("| trial 3 (sampled) |")
