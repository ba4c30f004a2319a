"""Search space, study files, numerics check, pin choice: the search's logic without trials."""

from __future__ import annotations

import optuna
import pytest

from budgettune.errors import StudyFileError, UsageError
from budgettune.pinning import Candidate, choose_pin, parse_pin, phase_advice
from budgettune.present.report import TrialRow, pareto_front
from budgettune.study.numerics import check_numerics, numerics_tolerance
from budgettune.study.space import (
    OP_LIST_MIN_BUDGET,
    SearchSpace,
    parse_fixed,
    spec_params,
    suggest_spec,
)
from budgettune.study.spec import SearchSpec
from budgettune.study.study import baseline_specs, default_study_name, high_budget_retry
from budgettune.study.study_file import build_search_spec, merge, read_study_file
from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _measurement(peak: int, time_ms: float, *, loss: float = 2.0, grad_norm: float = 1.0):
    return Measurement(
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak,
        peak_device_bytes=peak,
        steady_bytes=10,
        phase_peak_bytes={"forward": peak, "backward": peak - 1, "optimizer": 11},
        peak_phase="forward",
        step_time_ms=time_ms,
        step_time_p10_ms=time_ms,
        step_time_p90_ms=time_ms,
        compile_s=1.0,
        loss=loss,
        grad_norm=grad_norm,
    )


def _ok(peak: int, time_ms: float, **kw) -> TrialResult:
    return TrialResult(outcome=TrialOutcome.OK, measurement=_measurement(peak, time_ms, **kw))


def _sample(space: SearchSpace, n: int = 40) -> list[TrialSpec]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    specs = []
    for _ in range(n):
        trial = study.ask()
        specs.append(suggest_spec(trial, space, TrialSpec()))
        study.tell(trial, 1.0)
    return specs


def test_suggested_specs_stay_in_the_space_and_op_lists_only_near_budget_one() -> None:
    space = SearchSpace.for_device("cpu", block_ac_every=(0, 2), optimizer_impls=("fused",))
    specs = _sample(space, 60)
    assert {s.block_ac_every for s in specs} == {0, 2}
    assert {s.optimizer_impl for s in specs} == {"fused"}
    assert all(0.0 <= s.activation_memory_budget <= 1.0 for s in specs)
    for s in specs:
        if s.recompute_ops_removed or s.recompute_ops_added:
            assert s.activation_memory_budget >= OP_LIST_MIN_BUDGET
        assert set(s.recompute_ops_removed) <= set(space.removable_ops)
        assert set(s.recompute_ops_added) <= set(space.addable_ops)
    assert len({s.activation_memory_budget for s in specs}) > 30  # continuous


def test_fixed_dimensions_are_never_suggested() -> None:
    space = SearchSpace.for_device(
        "cpu", fixed={"knapsack_solver": "greedy", "activation_memory_budget": 0.4}
    )
    specs = _sample(space, 15)
    assert {s.knapsack_solver for s in specs} == {"greedy"}
    assert {s.activation_memory_budget for s in specs} == {0.4}


def test_enqueued_params_reproduce_the_spec() -> None:
    space = SearchSpace.for_device("cpu")
    spec = TrialSpec(
        activation_memory_budget=0.95,
        recompute_ops_removed=("aten.add",),
        recompute_ops_added=("aten.mm",),
        block_ac_every=2,
        block_ac_policy="op",
        optimizer_impl="fused",
    )
    study = optuna.create_study()
    study.enqueue_trial(spec_params(spec, space))
    trial = study.ask()
    assert suggest_spec(trial, space, TrialSpec()) == spec


def test_a_choice_narrowed_by_a_crash_is_still_drawn_in_the_same_study(tmp_path) -> None:
    """Optuna refuses a categorical param whose choices change within a study; a policy
    excluded after crashes (as op_offload on torch 2.11, H100 2026-11-26) must not fail every
    later trial that draws the policy."""
    from budgettune.study.crash_memory import narrow

    space = SearchSpace.for_device(
        "cpu", block_ac_every=(1, 2), block_ac_policies=("full", "op", "op_offload")
    )
    narrowed = narrow(space, [{"knob": "block_ac_policy", "value": "op_offload"}])
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 's.db'}", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    for _ in range(3):  # the study has drawn the declared policies
        trial = study.ask()
        suggest_spec(trial, space, TrialSpec())
        study.tell(trial, 1.0)
    trial = study.ask()
    with pytest.raises(ValueError, match="dynamic value space"):  # Optuna's rule, the cause
        suggest_spec(trial, narrowed, TrialSpec())
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    drawn = set()
    for _ in range(20):
        trial = study.ask()
        drawn.add(suggest_spec(trial, narrowed, TrialSpec(), declared=space).block_ac_policy)
        study.tell(trial, 1.0)
    assert drawn == {"full", "op"}
    assert "block_ac_policy[full|op]" in study.trials[-1].params


def test_search_space_rejects_bad_values() -> None:
    with pytest.raises(UsageError, match="unknown value"):
        SearchSpace(compile_modes=("turbo",))
    with pytest.raises(UsageError, match="budget range"):
        SearchSpace(budget_low=0.8, budget_high=0.2)
    with pytest.raises(UsageError, match="unknown dimension"):
        SearchSpace(fixed={"colour": "red"})
    with pytest.raises(UsageError):
        SearchSpace(fixed={"knapsack_solver": "magic"})


def test_parse_fixed() -> None:
    assert parse_fixed(
        ["knapsack_solver=dp", "block_ac_every=2", "activation_memory_budget=0.7"]
    ) == {
        "knapsack_solver": "dp",
        "block_ac_every": 2,
        "activation_memory_budget": 0.7,
    }
    with pytest.raises(UsageError, match="unknown dimension"):
        parse_fixed(["speed=fast"])
    with pytest.raises(UsageError, match="NAME=VALUE"):
        parse_fixed(["dp"])


def test_baselines_are_unconstrained_full_ac_half_budget_then_high_budget() -> None:
    search = build_search_spec(
        {"max_mem": "1GB", "fix": {"optimizer_impl": "fused"}}, default_device="cpu"
    )
    labels = [
        (label, s.activation_memory_budget, s.block_ac_every, s.optimizer_impl)
        for label, s in baseline_specs(search)
    ]
    assert labels == [
        ("unconstrained", 1.0, 0, "fused"),
        ("block-ac-every-1", 1.0, 1, "fused"),
        ("budget-0.5", 0.5, 0, "fused"),
        ("budget-0.8", 0.8, 0, "fused"),
    ]
    # the probe takes the leanest values of the searched knobs that cost no step time: fused
    # AdamW and expandable segments where searched, the user's fixed values otherwise
    probe = dict(baseline_specs(search))["budget-0.8"]
    assert (probe.optimizer_impl, probe.cuda_alloc_conf) == ("fused", "")  # CPU: one alloc conf
    for options, wanted in (
        ({}, ("fused", "expandable_segments:True")),
        ({"fix": {"cuda_alloc_conf": ""}}, ("fused", "")),
        ({"fix": {"optimizer_impl": "as_written"}}, ("as_written", "expandable_segments:True")),
        (
            {"space": {"optimizer_impls": ["as_written", "foreach"]}},
            ("as_written", "expandable_segments:True"),
        ),
    ):
        gpu = build_search_spec({"max_mem": "1GB", **options}, default_device="cuda")
        specs = dict(baseline_specs(gpu))
        probe = specs["budget-0.8"]
        assert (probe.optimizer_impl, probe.cuda_alloc_conf) == wanted, options
        # the reference runs stay as the user wrote them
        unconstrained = specs["unconstrained"]
        assert (unconstrained.activation_memory_budget, unconstrained.cuda_alloc_conf) == (1.0, "")
        # a crashed probe is measured again at the user's own values, unless it had them
        retry = high_budget_retry(gpu)
        assert retry is not None and (retry.optimizer_impl, retry.cuda_alloc_conf) == (
            unconstrained.optimizer_impl,
            "",
        )
        assert retry.activation_memory_budget == 0.8 and retry.block_ac_every == 0
    # CPU, optimizer fixed: the probe had the user's values, a retry would crash alike
    assert high_budget_retry(search) is None
    # no high-budget opening point in a short study (its trials are the sampler's), nor
    # where the user fixed the budget or narrowed its range below 0.8
    for options in (
        {"trials": 9},
        {"fix": {"activation_memory_budget": 0.6}},
        {"space": {"budget": [0.2, 0.6]}},
    ):
        few = build_search_spec({"max_mem": "1GB", **options}, default_device="cpu")
        labels = [label for label, _ in baseline_specs(few)]
        assert labels[:3] == ["unconstrained", "block-ac-every-1", "budget-0.5"], options
        assert "budget-0.8" not in labels, options
    # a study too short for the structured opening has the three baselines alone
    short = build_search_spec({"max_mem": "1GB", "trials": 5}, default_device="cpu")
    assert [label for label, _ in baseline_specs(short)] == [
        "unconstrained",
        "block-ac-every-1",
        "budget-0.5",
    ]


def test_the_numerics_reference_is_the_baselines_only_at_its_micro_batch() -> None:
    """Issue 46: another micro-batch is other data; its first step is no reference."""
    from budgettune.storage.user_attrs import TrialRecord
    from budgettune.study.numerics import reference_at
    from budgettune.trial.spec import TrialSpec

    baseline = TrialRecord(spec=TrialSpec(micro_batch=8, accum_steps=2), loss=2.0, grad_norm=1.0)
    first = {"loss": 2.0, "grad_norm": 1.0}
    assert reference_at(baseline, TrialSpec(micro_batch=8, accum_steps=2)) == first
    assert reference_at(baseline, TrialSpec(micro_batch=8, block_ac_every=1)) == first
    assert reference_at(baseline, TrialSpec(micro_batch=4, accum_steps=4)) is None
    assert reference_at(None, TrialSpec()) is None


def test_numerics_mismatch_is_flagged_with_dtype_aware_tolerance() -> None:
    reference = {"loss": 2.0, "grad_norm": 1.0}
    assert check_numerics(_ok(5, 1.0, loss=2.0001), reference).outcome is TrialOutcome.OK
    bad = check_numerics(_ok(5, 1.0, grad_norm=1.5), reference)
    assert bad.outcome is TrialOutcome.NUMERICS_MISMATCH and "grad_norm" in bad.error
    nan = check_numerics(_ok(5, 1.0, loss=float("nan")), reference)
    assert nan.outcome is TrialOutcome.NUMERICS_MISMATCH
    assert numerics_tolerance({"param_count": 10, "param_bytes": 20}) > numerics_tolerance(
        {"param_count": 10, "param_bytes": 40}
    )
    assert check_numerics(_ok(5, 1.0, loss=9.0), None).outcome is TrialOutcome.OK


def test_choose_pin_takes_fastest_whose_worst_rerun_fits_with_margin() -> None:
    fast = Candidate(
        trial_number=1,
        spec=TrialSpec(activation_memory_budget=0.9),
        step_time_ms=10,
        peak_bytes=95,
    )
    slow = Candidate(
        trial_number=2,
        spec=TrialSpec(activation_memory_budget=0.2),
        step_time_ms=14,
        peak_bytes=70,
    )
    reruns = {1: [_ok(95, 10.0), _ok(99, 10.2)], 2: [_ok(70, 14.0), _ok(71, 14.1)]}
    # fast's worst (99) * 1.03 > 100 → slow wins
    chosen = choose_pin([fast, slow], reruns, limit_bytes=100, mem_metric="device", margin=0.03)
    assert chosen is not None and chosen[0] is slow
    chosen = choose_pin([fast, slow], reruns, limit_bytes=100, mem_metric="device", margin=0.0)
    assert chosen is not None and chosen[0] is fast
    reruns[2].append(TrialResult(outcome=TrialOutcome.OOM, error="oom"))
    assert (
        choose_pin([fast, slow], reruns, limit_bytes=100, mem_metric="device", margin=0.03) is None
    )


def test_pareto_front() -> None:
    def row(n, peak, ms):
        return TrialRow(
            number=n,
            state="COMPLETE",
            outcome="ok",
            baseline="",
            config="",
            peak_bytes=peak,
            step_time_ms=ms,
            slowdown=None,
            peak_phase="",
            feasible=True,
            error="",
        )

    rows = [row(0, 100, 10), row(1, 80, 12), row(2, 90, 13), row(3, 60, 20), row(4, 60, 25)]
    assert [r.number for r in pareto_front(rows)] == [3, 1, 0]


def test_phase_advice_points_at_the_optimizer_knob() -> None:
    assert "optimizer_impl" in phase_advice("optimizer")
    assert phase_advice("backward") == ""


def test_study_file_unknown_key_and_merge(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'workload = "builtin:tiny-gpt"\nmax_mem = "100MB"\n[space]\ncompile_modes = ["default"]\n'
    )
    values = read_study_file(path)
    merged = merge(
        values, {"max_mem": "90MB", "space": {"compile_modes": None, "block_ac_every": [0, 1]}}
    )
    assert merged["max_mem"] == "90MB"
    assert merged["space"] == {"compile_modes": ["default"], "block_ac_every": [0, 1]}
    spec = build_search_spec(merged, default_device="cpu")
    assert isinstance(spec, SearchSpec) and spec.max_mem_bytes == 90_000_000
    assert spec.space.block_ac_every == (0, 1)
    (tmp_path / "bad.toml").write_text('max_mem = "1GB"\nbudgett = 0.5\n')
    with pytest.raises(StudyFileError, match="unknown key 'budgett'"):
        read_study_file(tmp_path / "bad.toml")
    (tmp_path / "bad2.toml").write_text('[space]\nmode = ["default"]\n')
    with pytest.raises(StudyFileError, match="space.mode"):
        read_study_file(tmp_path / "bad2.toml")
    (tmp_path / "broken.toml").write_text("max_mem = \n")
    with pytest.raises(StudyFileError, match="not a valid TOML"):
        read_study_file(tmp_path / "broken.toml")
    with pytest.raises(StudyFileError, match="no such study file"):
        read_study_file(tmp_path / "missing.toml")


def test_shipped_study_files_parse() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "studies"
    for name, device in (("tiny-gpt-cpu.toml", "cpu"), ("llama-1b.toml", "cuda")):
        spec = build_search_spec(read_study_file(root / name), default_device="cpu")
        assert spec.device == device


@pytest.mark.parametrize("limit", ["banana", "0", "-3GB"])
def test_bad_limits_are_usage_errors(limit) -> None:
    with pytest.raises(UsageError):
        build_search_spec({"max_mem": limit}, default_device="cpu")


def test_missing_limit_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--max-mem is required"):
        build_search_spec({}, default_device="cpu")


def test_default_study_name_is_stable_and_distinct() -> None:
    a = default_study_name("builtin:tiny-gpt", {}, "cpu", 120_000_000, "device")
    assert a == default_study_name("builtin:tiny-gpt", {}, "cpu", 120_000_000, "device")
    assert a != default_study_name(
        "builtin:tiny-gpt", {"batch_size": 8}, "cpu", 120_000_000, "device"
    )
    assert "train" in default_study_name("src/train.py:build", {}, "cuda:1", 2e10, "device")


def test_describe_spec() -> None:
    text = (
        TrialSpec(
            activation_memory_budget=0.5,
            block_ac_every=2,
            optimizer_impl="fused",
            recompute_ops_removed=("aten.add",),
        )
    ).describe()
    assert text == "budget 0.50, -add, AC every 2 (full), optimizer fused"


def test_parse_pin_rejects_other_schema_and_bad_spec() -> None:
    from budgettune.errors import PinnedConfigError

    with pytest.raises(PinnedConfigError, match="schema version 2"):
        parse_pin({"schema_version": 2, "spec": {}})
    with pytest.raises(PinnedConfigError, match="invalid pinned spec"):
        parse_pin({"schema_version": 1, "spec": {"activation_memory_budget": 3}})
    with pytest.raises(PinnedConfigError, match="JSON object"):
        parse_pin([1, 2])


@pytest.mark.parametrize(
    ("metric", "shown", "hidden"),
    [
        ("allocated", "13.11 GB (12.21 GiB) allocated", "14.05"),
        ("device", "14.05 GB (13.09 GiB)", "13.11"),
    ],
)
def test_the_progress_line_shows_the_peak_the_limit_is_on(metric, shown, hidden) -> None:
    """The first two-GPU search (limit on the allocated peak) printed each trial's device peak:
    "trial 2: ok 47.22 GB" under a 42 GB limit that it fitted (39.99 GB allocated)."""
    from storage_samples import ok_result

    from budgettune.cli.app import stderr
    from budgettune.cli.progress import SearchProgress
    from budgettune.study.study import TrialEvent

    event = TrialEvent(
        number=2, done=1, total=6, spec=TrialSpec(activation_memory_budget=0.5),
        result=ok_result(), best_ms=62.9, fits=True, mem_metric=metric,
    )  # fmt: skip
    with stderr.capture() as captured, SearchProgress() as progress:
        progress.started("s", 6)
        progress.trial_done(event)
    line = next(x for x in captured.get().splitlines() if x.startswith("trial 2:"))
    assert line.startswith(f"trial 2: ok {shown}, 62.9 ms budget 0.50"), line
    assert hidden not in line


@pytest.mark.parametrize("has_widgets", [False, True])
def test_in_a_notebook_without_ipywidgets_the_bar_is_left_out_and_trial_lines_stay(
    monkeypatch: pytest.MonkeyPatch, has_widgets: bool
) -> None:
    """Issue 32: `budgettune.search` from a notebook. rich's live bar needs ipywidgets there;
    without it rich only warns, so the bar is off and each finished trial's line is printed."""
    import importlib.util
    import io

    from rich.console import Console
    from storage_samples import ok_result

    from budgettune.cli import progress as progress_module
    from budgettune.study.study import TrialEvent

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "ipywidgets":
            return object() if has_widgets else None
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    notebook = Console(file=io.StringIO(), force_jupyter=True, width=120)
    assert notebook.is_jupyter
    terminal = Console(file=io.StringIO(), force_jupyter=False)
    assert progress_module.live_bar_possible(terminal)
    assert progress_module.live_bar_possible(notebook) is has_widgets
    shown = progress_module.SearchProgress(console=notebook)
    assert shown.progress.disable is not has_widgets
    if not has_widgets:
        event = TrialEvent(
            number=0, done=1, total=2, spec=TrialSpec(), result=ok_result(), best_ms=10.0,
            fits=True, mem_metric="device",
        )  # fmt: skip
        with notebook.capture() as captured, shown:
            shown.started("s", 2)
            shown.trial_done(event)
        assert "trial 0: ok" in captured.get()


def test_the_sampler_is_a_study_key_and_a_gp_draws_within_the_constraint(tmp_path) -> None:
    """``sampler = "gp"`` (or ``--sampler gp``) gives Optuna's GPSampler with the limit as its
    constraint; it draws the same space as TPE, a conditional choice (the block-AC policy)
    at random; an unknown sampler is one line naming the choices."""
    from budgettune.study.study import constraints_of, make_sampler

    path = tmp_path / "s.toml"
    path.write_text('workload = "builtin:tiny-gpt"\nmax_mem = "1GB"\nsampler = "gp"\n')
    spec = build_search_spec(read_study_file(path), default_device="cpu")
    assert spec.sampler == "gp" and SearchSpec.from_json_dict(spec.to_json_dict()) == spec
    sampler = make_sampler(spec.replace(sampler_seed=1))
    assert isinstance(sampler, optuna.samplers.GPSampler)
    assert isinstance(make_sampler(spec.replace(sampler="tpe")), optuna.samplers.TPESampler)
    study = optuna.create_study(sampler=sampler)
    for number in range(12):
        trial = study.ask()
        drawn = suggest_spec(trial, spec.space, spec.base)
        budget = drawn.activation_memory_budget
        trial.set_user_attr("constraint", [budget - 0.5])  # "fits" below budget 0.5
        assert constraints_of(study.trials[number]) in ([budget - 0.5], [0.0])
        study.tell(trial, 100 - 50 * budget + 10 * drawn.block_ac_every)
    assert study.best_trial.params["activation_memory_budget"] <= 0.5
    path.write_text('workload = "builtin:tiny-gpt"\nmax_mem = "1GB"\nsampler = "bayes"\n')
    with pytest.raises(StudyFileError, match="sampler must be one of tpe, gp, got 'bayes'"):
        read_study_file(path)
    with pytest.raises(UsageError, match="--sampler: unknown sampler 'bayes'; choose one of tpe"):
        spec.replace(sampler="bayes")


def test_the_gp_sampler_without_scipy_is_one_line_naming_the_extra(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a)
    )
    spec = SearchSpec(
        workload="builtin:tiny-gpt", study_name="s", max_mem_bytes=10**9, space=SearchSpace()
    )
    with pytest.raises(UsageError, match=r"--sampler gp needs scipy: .*'budgettune\[gp\]'"):
        spec.replace(sampler="gp")
    assert spec.sampler == "tpe"  # TPE needs nothing more
