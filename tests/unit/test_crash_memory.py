"""Crash memory (issue 9): which knob values a study stops proposing, and the narrowed space."""

from __future__ import annotations

from typing import Any

from budgettune.storage.trials import describe_exclusion
from budgettune.study.crash_memory import error_shape, find_exclusions, narrow
from budgettune.study.space import SearchSpace


def _attrs(outcome: str, error: str = "", baseline: str | None = None, **spec: Any) -> dict:
    attrs: dict[str, Any] = {"outcome": outcome, "error": error, "spec": spec}
    if baseline:
        attrs["baseline"] = baseline
    return attrs


OK = _attrs("ok", baseline="unconstrained")


def test_error_shape_strips_numbers_and_addresses() -> None:
    a = error_shape("RuntimeError: size (2048) must match (1024) at 0x7f3a\nmore")
    b = error_shape("RuntimeError: size (4096) must match (512) at 0x1b2c")
    assert a == b == "RuntimeError: size (N) must match (N) at N"
    assert error_shape("ValueError: other") != a


def test_crashed_full_ac_baseline_excludes_block_ac() -> None:
    trials = [
        (0, OK),
        (1, _attrs("crashed", "RuntimeError: x (3)", "block-ac-every-1", block_ac_every=1)),
    ]
    [entry] = find_exclusions(trials, [])
    assert (entry["knob"], entry["value"], entry["trials"]) == ("block_ac", "on", [1])
    assert "block AC excluded: its baseline crashed (trial 1)" in describe_exclusion(entry)
    assert find_exclusions(trials, [entry]) == []  # said once


def test_baseline_crash_excludes_nothing_when_block_ac_ran_elsewhere() -> None:
    trials = [
        (0, OK),
        (1, _attrs("crashed", "E: flaky", "block-ac-every-1", block_ac_every=1)),
        (2, _attrs("ok", block_ac_every=2, block_ac_policy="op")),
    ]
    assert find_exclusions(trials, []) == []


def test_same_crash_twice_blames_the_shared_value_no_run_had() -> None:
    op = dict(block_ac_every=2, block_ac_policy="op")
    trials = [
        (0, OK),
        (1, _attrs("ok", block_ac_every=1, block_ac_policy="full")),
        (2, _attrs("crashed", "RuntimeError: aten.slice index 4 not found", **op)),
        (3, _attrs("ok", activation_memory_budget=0.5)),
    ]
    assert find_exclusions(trials, []) == []  # one crash: maybe flaky, retried as today
    trials.append((4, _attrs("crashed", "RuntimeError: aten.slice index 7 not found", **op)))
    [entry] = find_exclusions(trials, [])
    # block AC ran (trial 1): the op policy is blamed, before the stride (coarse first).
    assert (entry["knob"], entry["value"], entry["trials"]) == ("block_ac_policy", "op", [2, 4])


def test_different_crashes_exclude_nothing() -> None:
    trials = [
        (0, OK),
        (1, _attrs("crashed", "OSError: node lost", optimizer_impl="fused")),
        (2, _attrs("crashed", "RuntimeError: CUDA error", optimizer_impl="fused")),
    ]
    assert find_exclusions(trials, []) == []


def test_narrow_drops_values_but_never_fixed_or_last_ones() -> None:
    space = SearchSpace(block_ac_every=(0, 1, 2), block_ac_policies=("full", "op"))
    narrowed = narrow(space, [{"knob": "block_ac", "value": "on"}])
    assert narrowed.block_ac_every == (0,)
    narrowed = narrow(space, [{"knob": "block_ac_policy", "value": "op"}])
    assert narrowed.block_ac_policies == ("full",)
    narrowed = narrow(space, [{"knob": "block_ac_every", "value": 2}])
    assert narrowed.block_ac_every == (0, 1)
    fixed = space.replace(fixed={"optimizer_impl": "fused"})
    assert narrow(fixed, [{"knob": "optimizer_impl", "value": "fused"}]) == fixed
    one = SearchSpace(optimizer_impls=("fused",))
    assert narrow(one, [{"knob": "optimizer_impl", "value": "fused"}]) == one
