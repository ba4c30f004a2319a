"""TrialSpec / TrialRun / TrialResult validation and JSON round trips; byte units."""

from __future__ import annotations

import json

import pytest

from budgettune.errors import SpecError, UsageError
from budgettune.trial.results import (
    Measurement,
    TrialOutcome,
    TrialResult,
    read_result,
    write_result_atomically,
)
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun
from budgettune.units import format_bytes, parse_bytes


def _measurement(**changes):
    values = dict(
        peak_allocated_bytes=100,
        peak_reserved_bytes=120,
        peak_device_bytes=150,
        steady_bytes=40,
        phase_peak_bytes={"forward": 90, "backward": 100, "optimizer": 60},
        peak_phase="backward",
        step_time_ms=12.5,
        step_time_p10_ms=12.0,
        step_time_p90_ms=13.0,
        compile_s=3.0,
        loss=5.5,
        grad_norm=1.25,
    )
    values.update(changes)
    return Measurement(**values)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"activation_memory_budget": 1.5}, "within [0, 1]"),
        ({"activation_memory_budget": -0.1}, "within [0, 1]"),
        ({"activation_memory_budget": "0.5"}, "must be a number"),
        ({"knapsack_solver": "magic"}, "unknown knapsack_solver"),
        ({"runtime_estimator": "guess"}, "unknown runtime_estimator"),
        ({"compile_mode": "turbo"}, "unknown compile_mode"),
        ({"compile_backend": "tvm"}, "unknown compile_backend"),
        ({"optimizer_impl": "cuda"}, "unknown optimizer_impl"),
        ({"block_ac_every": -1}, "an integer from 0 to"),
        ({"block_ac_every": 10**30}, "an integer from 0 to"),
        ({"seed": 10**400}, "seed must be an integer from 0 to"),
        ({"recompute_ops_removed": ("add",)}, "not an op name"),
        ({"recompute_ops_removed": ("aten.mm",), "recompute_ops_added": ("aten.mm",)}, "both"),
        (
            {"compile_backend": "aot_eager_decomp_partition", "compile_mode": "max-autotune"},
            "needs",
        ),
        ({"warmup_steps": 0}, "must be from 1"),
    ],
)
def test_spec_rejects_bad_values(changes, fragment) -> None:
    with pytest.raises(SpecError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        TrialSpec(**changes)


def test_spec_errors_are_usage_errors_and_value_errors() -> None:
    with pytest.raises(UsageError):
        TrialSpec(activation_memory_budget=2)
    with pytest.raises(ValueError):
        TrialSpec(activation_memory_budget=2)


def test_spec_json_round_trip_and_unknown_key() -> None:
    spec = TrialSpec(
        activation_memory_budget=0.3,
        recompute_ops_removed=("aten.mul", "aten.add", "aten.add"),
        recompute_ops_added=("aten.mm",),
        block_ac_every=2,
    )
    assert spec.recompute_ops_removed == ("aten.add", "aten.mul")
    again = TrialSpec.from_json_dict(json.loads(json.dumps(spec.to_json_dict())))
    assert again == spec
    with pytest.raises(SpecError, match="unknown TrialSpec key"):
        TrialSpec.from_json_dict({"budget": 0.5})


def test_partition_variant_ignores_budget_but_not_solver_or_ops() -> None:
    base = TrialSpec()
    assert base.replace(activation_memory_budget=0.2).partition_variant() == (
        base.replace(activation_memory_budget=0.7).partition_variant()
    )
    # below 1.0 the random-draw pass runs, which AOTAutograd's key ignores: not 1.0's cache
    assert base.replace(activation_memory_budget=0.2).partition_variant() != (
        base.partition_variant()
    )
    others = {
        base.replace(knapsack_solver="greedy").partition_variant(),
        base.replace(runtime_estimator="profile").partition_variant(),
        base.replace(recompute_ops_removed=("aten.add",)).partition_variant(),
        base.replace(recompute_ops_added=("aten.add",)).partition_variant(),
        base.partition_variant(),
    }
    assert len(others) == 5


def test_trial_run_round_trip_and_cache_dir() -> None:
    run = TrialRun(
        spec=TrialSpec(knapsack_solver="greedy"),
        workload="builtin:tiny-gpt",
        workload_options={"batch_size": 4},
        device="cuda:1",
        cache_root="/tmp/cache/",
    )
    assert TrialRun.from_json_dict(run.to_json_dict()) == run
    assert run.cache_dir() == f"/tmp/cache/{run.spec.partition_variant()}"
    assert TrialRun(spec=TrialSpec(), workload="builtin:x").cache_dir() is None
    with pytest.raises(SpecError, match="device"):
        TrialRun(spec=TrialSpec(), workload="builtin:x", device="gpu0")


def test_result_round_trip_through_atomic_file(tmp_path) -> None:
    result = TrialResult(
        outcome=TrialOutcome.OK,
        measurement=_measurement(),
        device_name="cpu",
        torch_version="2.13.0",
        workload_fingerprint={"param_count": 3, "digest": "ab"},
    )
    path = tmp_path / "RESULT.json"
    write_result_atomically(path, result)
    assert read_result(path) == result
    assert [p.name for p in tmp_path.iterdir()] == ["RESULT.json"]


def test_result_needs_measurement_when_measured() -> None:
    with pytest.raises(SpecError):
        TrialResult(outcome=TrialOutcome.OK)
    assert TrialResult(outcome="oom").outcome is TrialOutcome.OOM


def test_outcome_behaviour() -> None:
    assert TrialOutcome.OK.is_feasible()
    assert not TrialOutcome.OOM.is_feasible()
    assert TrialOutcome.OOM.is_infeasible_result()
    assert TrialOutcome.NUMERICS_MISMATCH.is_infeasible_result()
    assert not TrialOutcome.CRASHED.is_infeasible_result()
    assert TrialOutcome.NUMERICS_MISMATCH.is_measured() and not TrialOutcome.TIMEOUT.is_measured()


def test_a_non_finite_loss_is_never_feasible_and_tells_nothing_about_fit() -> None:
    non_finite = TrialOutcome("non_finite")
    assert not non_finite.is_feasible() and not non_finite.is_measured()
    assert non_finite.is_infeasible_result()  # pruned with a constraint, like an OOM
    assert non_finite.ran() and not TrialOutcome.CRASHED.ran()  # crash memory blames nothing
    assert not non_finite.tells_fit() and not TrialOutcome.TIMEOUT.tells_fit()
    assert TrialOutcome.OOM.tells_fit() and TrialOutcome.NUMERICS_MISMATCH.tells_fit()
    result = TrialResult(outcome=non_finite, error="first-step loss nan")  # no figures needed
    assert TrialResult.from_json_dict(result.to_json_dict()) == result


def test_measurement_peak_by_metric() -> None:
    m = _measurement()
    assert (m.peak_bytes("device"), m.peak_bytes("reserved"), m.peak_bytes("allocated")) == (
        150,
        120,
        100,
    )
    with pytest.raises(SpecError):
        m.peak_bytes("rss")


@pytest.mark.parametrize(
    "text, expected",
    [("20GB", 20 * 10**9), ("1GiB", 2**30), ("900MB", 900 * 10**6), ("12345", 12345), (7, 7)],
)
def test_parse_bytes(text, expected) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["banana", "0", "-5GB", "", "12 parsecs"])
def test_parse_bytes_rejects(text) -> None:
    with pytest.raises(UsageError):
        parse_bytes(text, what="--max-mem")


def test_format_bytes_shows_both_units() -> None:
    assert format_bytes(15_060_000_000) == "15.06 GB (14.03 GiB)"
    assert format_bytes(149_000_000) == "149.00 MB (142.10 MiB)"
    assert format_bytes(None) == "-"


def test_a_margin_is_written_as_a_percent_never_rounded_to_nothing() -> None:
    from budgettune.units import format_percent

    assert [format_percent(m) for m in (0.02, 0.005, 0.0, 0.125)] == ["2%", "0.5%", "0%", "12.5%"]
