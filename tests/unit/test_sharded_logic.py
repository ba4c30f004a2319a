"""Sharded trials without processes: merging ranks, GPU groups, the pin's split and warning."""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from storage_samples import ok_result

from budgettune.errors import SpecError, UsageError
from budgettune.storage.user_attrs import TrialRecord
from budgettune.trial.ranks import (
    memory_split,
    merge_rank_results,
    per_rank_figures,
    rank_result_path,
    world_size_warning,
)
from budgettune.trial.results import RankFigures, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


def _rank(peak: int, ms: float, steady: int = 1_000) -> TrialResult:
    result = ok_result()
    assert result.measurement is not None
    m = replace(
        result.measurement,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak + 10,
        peak_device_bytes=peak + 20,
        steady_bytes=steady,
        step_time_ms=ms,
        phase_peak_bytes={"forward": peak // 2, "backward": peak, "optimizer": steady},
    )
    return replace(result, measurement=m)


def test_merge_takes_the_largest_peak_and_the_slowest_step() -> None:
    merged = merge_rank_results({0: _rank(5_000, 10.0), 1: _rank(7_000, 9.0)})
    assert merged.outcome is TrialOutcome.OK and merged.world_size == 2
    m = merged.measurement
    assert m is not None
    assert (m.peak_allocated_bytes, m.peak_device_bytes, m.step_time_ms) == (7_000, 7_020, 10.0)
    assert [r.measurement.peak_allocated_bytes for r in merged.ranks if r.measurement] == [
        5_000,
        7_000,
    ]
    again = TrialResult.from_json_dict(json.loads(json.dumps(merged.to_json_dict())))
    assert again == merged


def test_merge_names_the_rank_that_failed_first_not_the_ones_it_took_down() -> None:
    crash = TrialResult(outcome=TrialOutcome.CRASHED, error="ValueError: boom", failed_at_s=100.0)
    broken = TrialResult(
        outcome=TrialOutcome.CRASHED, error="RuntimeError: peer closed", failed_at_s=100.5
    )
    merged = merge_rank_results({0: broken, 1: crash})
    assert merged.failed_rank == 1 and merged.error.startswith("rank 1 of 2: ValueError")
    died = TrialResult(outcome=TrialOutcome.CRASHED, error="exited 7", failed_stage="died")
    assert merge_rank_results({0: broken, 1: died}).failed_rank == 1
    oom = TrialResult(outcome=TrialOutcome.OOM, error="OutOfMemoryError", failed_at_s=101.0)
    stopped = TrialResult(outcome=TrialOutcome.CRASHED, error="stopped", failed_stage="terminated")
    merged = merge_rank_results({0: stopped, 1: oom, 2: _rank(1, 1.0)})
    assert (merged.outcome, merged.failed_rank) == (TrialOutcome.OOM, 1)
    missing = merge_rank_results({0: None, 1: stopped}, launcher_error="killed by SIGKILL")
    assert (missing.outcome, missing.failed_rank) == (TrialOutcome.CRASHED, 0)
    assert "killed by SIGKILL" in missing.error


def test_rank_result_path() -> None:
    assert rank_result_path("/r/RESULT.json", 3) == Path("/r/RESULT.rank3.json")


def test_a_gpu_group_lists_one_gpu_per_rank() -> None:
    spec = TrialSpec()
    assert TrialRun(spec=spec, workload="builtin:llama", device="cuda:2,3", nproc_per_node=2)
    with pytest.raises(SpecError, match="one GPU per rank"):
        TrialRun(spec=spec, workload="builtin:llama", device="cuda:1", nproc_per_node=2)
    with pytest.raises(SpecError, match="from 1 to 4096"):
        TrialRun(spec=spec, workload="builtin:llama", nproc_per_node=0)


def test_gpu_groups_and_worker_commands() -> None:
    from budgettune.study.workers import gpu_groups, worker_command

    assert gpu_groups([0, 1, 2, 3], 2) == [(0, 1), (2, 3)]
    assert gpu_groups([4, 5], 1) == [(4,), (5,)]
    with pytest.raises(UsageError, match="groups of --nproc-per-node 2"):
        gpu_groups([0, 1, 2], 2)
    command = worker_command(study_name="s", gpu=(2, 3), runs_dir="r")
    assert command[command.index("--device") + 1] == "cuda:2,3"


def test_study_file_and_baselines_of_a_sharded_study(tmp_path: Path) -> None:
    from budgettune.study.study import baseline_specs, study_attrs
    from budgettune.study.study_file import build_search_spec, read_study_file

    root = Path(__file__).resolve().parents[2]
    values = read_study_file(root / "studies" / "llama-2xh200-sharded.toml")
    search = build_search_spec(values, default_device="cuda")
    assert search.nproc_per_node == 2 and search.trial_run(search.base).nproc_per_node == 2
    labels = dict(baseline_specs(search))
    assert labels["op-sac"].block_ac_policy == "op" and labels["op-sac"].block_ac_every == 1
    assert study_attrs(search)["nproc_per_node"] == 2
    single = search.replace(nproc_per_node=1)
    assert "op-sac" not in dict(baseline_specs(single))
    assert "nproc_per_node" not in study_attrs(single)


def test_pin_records_world_size_split_and_op_sac() -> None:
    from budgettune.pinning import Candidate, build_pin
    from budgettune.study.pin import pin_scope, reference_trial
    from budgettune.study.space import SearchSpace
    from budgettune.study.spec import SearchSpec

    search = SearchSpec(
        workload="builtin:llama",
        device="cuda",
        max_mem_bytes=42_000_000_000,
        mem_metric="allocated",
        study_name="s",
        space=SearchSpace.for_device("cuda"),
        nproc_per_node=2,
    )
    runs = [
        merge_rank_results(
            {0: _rank(40_000_000_000, 288.0, 9e9), 1: _rank(40_500_000_000, 290.0, 9e9)}
        )
        for _ in range(2)
    ]
    candidate = Candidate(
        trial_number=5, spec=TrialSpec(activation_memory_budget=0.5), step_time_ms=288.0,
        peak_bytes=40_500_000_000,
    )  # fmt: skip
    op_attrs = {
        "spec": TrialSpec(block_ac_every=1, block_ac_policy="op").to_json_dict(),
        "peak_allocated_bytes": 37_600_000_000,
        "peak_device_bytes": 38_000_000_000,
        "step_time_ms": 295.0,
    }
    op_sac = reference_trial(TrialRecord.from_attrs(op_attrs), "allocated")
    pin = build_pin(
        scope=pin_scope(search), candidate=candidate, reverify_results=runs, baseline=None,
        trials=9, op_sac=op_sac,
    )  # fmt: skip
    doc = pin.to_json_dict()
    assert doc["world_size"] == 2 and doc["sharding"].startswith("fsdp2")
    assert [row["rank"] for row in doc["measured"]["per_rank"]] == [0, 1]
    assert doc["measured"]["split"] == {
        "sharded_state_bytes": 9_000_000_000,
        "activation_bytes": 31_500_000_000,
        "peak_allocated_bytes": 40_500_000_000,
    }
    assert doc["op_sac"]["fits"] is True
    assert doc["op_sac"]["slowdown"] == pytest.approx(290.0 / 295.0 - 1)
    from budgettune.present.tables import pin_table

    assert pin_table(pin).row_count > 10


def test_per_rank_figures_and_split() -> None:
    merged = merge_rank_results({0: _rank(5_000, 10.0, 2_000), 1: _rank(7_000, 9.0, 2_000)})
    rows = per_rank_figures([merged, merged], "allocated")
    assert [(r["rank"], r["peak_worst_bytes"]) for r in rows] == [(0, 5_000), (1, 7_000)]
    assert memory_split(rows)["activation_bytes"] == 5_000


def test_a_pin_applied_with_another_world_size_warns_with_the_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import budgettune
    from budgettune.pinning import StalePinWarning, write_pin

    split = {"sharded_state_bytes": 8e9, "activation_bytes": 30e9, "peak_allocated_bytes": 38e9}
    text = world_size_warning(pinned_world=2, running_world=4, split=split)  # type: ignore[arg-type]
    assert "scales with 1/world size" in text and "34.00 GB per rank" in text
    spec = TrialSpec(compile_mode="eager")
    doc = {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 42_000_000_000,
        "mem_metric": "allocated",
        "world_size": 2,
        "measured": {"split": split},
        "fingerprint": {"torch_version": torch.__version__, "cuda_version": "", "workload": {}},
    }
    path = write_pin(tmp_path / "pin.json", doc)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        budgettune.load_pinned(path).compile(torch.nn.Linear(2, 2))
    messages = [str(w.message) for w in caught if issubclass(w.category, StalePinWarning)]
    assert any(
        "world size 2, this job runs 1" in m and "activations 30.00 GB" in m for m in messages
    )


def test_rank_figures_round_trip() -> None:
    figures = RankFigures(rank=1, outcome=TrialOutcome.OOM, error="OutOfMemoryError")
    assert RankFigures.from_json_dict(figures.to_json_dict()) == figures


def test_dashboard_note_and_points_show_ranks_and_op_sac() -> None:
    import optuna

    from budgettune.pinning import PinDocument
    from budgettune.present.dashboard_views import study_note, trial_points

    trial = optuna.trial.create_trial(
        value=290.0,
        user_attrs={
            "outcome": "ok",
            "spec": TrialSpec(activation_memory_budget=0.5).to_json_dict(),
            "peak_allocated_bytes": 40_500_000_000,
            "step_time_ms": 290.0,
            "constraint": [-1.0],
            "world_size": 2,
            "ranks": [
                {"rank": 0, "outcome": "ok", "peak_allocated_bytes": 40_000_000_000},
                {"rank": 1, "outcome": "ok", "peak_allocated_bytes": 40_500_000_000},
            ],
        },
    )
    (point,) = trial_points([trial], "allocated")
    assert point.rank_peaks == (40_000_000_000, 40_500_000_000)
    pin = {
        "trial_number": 0,
        "spec": TrialSpec(activation_memory_budget=0.5).to_json_dict(),
        "mem_metric": "allocated",
        "limit_bytes": 42_000_000_000,
        "measured": {
            "runs": 1,
            "peak_worst_bytes": 40_500_000_000,
            "step_time_ms": 290.0,
            "per_rank": [
                {"rank": r, "peak_worst_bytes": 4e10, "steady_bytes": 9e9, "step_time_ms": 290.0}
                for r in (0, 1)
            ],
        },
        "op_sac": {"slowdown": -0.017, "step_time_ms": 295.0, "peak_bytes": 3.76e10, "fits": True},
        "world_size": 2,
        "sharding": "fsdp2",
    }
    typed = PinDocument.from_json_dict(pin)
    note = study_note(study_name="s", search={}, points=[point], num_failed=0, pin=typed)
    assert "slowdown vs torchtitan op SAC | -1.7%" in note
    assert "| world size | 2 ranks, fsdp2 |" in note and "| rank 1 | peak 40.00 GB" in note


def test_show_keeps_the_config_and_each_ranks_peak_in_80_columns() -> None:
    """The first two-GPU `show` (a file, 80 columns) cut the step times and lost the config
    column to a per-rank column; each rank's peak now leads the config cell, which wraps."""
    from rich.console import Console

    from budgettune.present.report import StudyReport, TrialRow
    from budgettune.present.tables import study_tables

    rows = tuple(
        TrialRow(
            number=n,
            state="COMPLETE",
            outcome="ok",
            baseline=label,
            config=config,
            peak_bytes=max(p for p in peaks if p),
            step_time_ms=ms,
            slowdown=0.05 * n,
            peak_phase="backward",
            feasible=True,
            error="",
            rank_peaks=peaks,
            rank_step_ms=(ms, ms - 1),
            slowdown_vs_full_ac=-0.1,
        )
        for n, label, config, peaks, ms in (
            (
                0,
                "unconstrained",
                "budget 1.00, optimizer as_written",
                (49_690_000_000, 49_680_000_000),
                290.79,
            ),
            (1, "", "budget 0.50, optimizer as_written", (39_990_000_000, None), 305.32),
        )
    )
    report = StudyReport(
        study_name="s", workload="builtin:llama", limit_bytes=42_000_000_000,
        mem_metric="allocated", margin=0.02, baseline_status="over_limit", rows=rows,
        best=None, pareto=(), pin=None, advice="", world_size=2,
    )  # fmt: skip
    out = io.StringIO()  # as `show` prints into a file or a pipe: 80 columns, soft wrap
    Console(width=80, soft_wrap=True, markup=False, file=out).print(study_tables(report)[0])
    text = out.getvalue()
    assert "290.8" in text and "305.3" in text  # the step times whole, not "290…"
    assert "ranks 49.69, 49.68" in text and "ranks 39.99, -" in text
    assert "[unconstrained] budget" in text and "optimizer" in text
    assert "2 ranks per trial" in text
