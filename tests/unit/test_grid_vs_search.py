"""Issue 30's benchmark script: the grid it measures, the limit it sets, the grid best a pin is
held to (same margin), and the row it records; the GPU runs themselves are in
benchmarks/results/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
