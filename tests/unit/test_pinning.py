"""load_pinned(...).compile(model) in a training job, the stale-fingerprint warning, and the
example loop; the pin document written by the search is covered by the CLI integration tests."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch

import budgettune
from budgettune.errors import PinnedConfigError
from budgettune.pinning import StalePinWarning, write_pin
from budgettune.trial.spec import TrialSpec
from budgettune.workloads.tiny_gpt import build

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_with_pinned.py"


def _pin(tmp_path: Path, spec: TrialSpec, **fingerprint) -> Path:
    doc = {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "workload_options": {},
        "limit_bytes": 125_000_000,
        "mem_metric": "device",
        "fingerprint": {
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda or "",
            "device_name": "cpu (x86_64)",
            "workload": {},
            **fingerprint,
        },
    }
    return write_pin(tmp_path / "best.json", doc)


SPEC = TrialSpec(
    activation_memory_budget=0.3,
    compile_backend="aot_eager_decomp_partition",
    block_ac_every=2,
    optimizer_impl="foreach",
)


def test_compiled_pin_trains_like_the_plain_model(tmp_path: Path) -> None:
    path = _pin(tmp_path, SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePinWarning)
        pinned = budgettune.load_pinned(path)
    assert pinned.spec == SPEC
    torch.manual_seed(0)
    reference = build(torch.device("cpu"), n_layers=2)
    torch.manual_seed(0)
    workload = build(torch.device("cpu"), n_layers=2)
    model = pinned.compile(workload.model)
    optimizer = pinned.optimizer(torch.optim.AdamW(workload.model.parameters(), lr=1e-3))
    assert optimizer.defaults["foreach"] is True
    loss = workload.loss(model, workload.batch)
    loss.backward()
    expected = reference.loss(reference.model, reference.batch)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    for mine, theirs in zip(workload.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-5)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # the partitioner settings were scoped to the pinned model's calls, never set globally
    assert torch._functorch.config.activation_memory_budget == 1.0


def test_stale_pin_warns(tmp_path: Path) -> None:
    path = _pin(tmp_path, SPEC, torch_version="1.0.0")
    with pytest.warns(StalePinWarning, match="torch"):
        budgettune.load_pinned(path)
    path = _pin(tmp_path, SPEC, workload={"param_count": 7})
    pinned = budgettune.load_pinned(path)
    with pytest.warns(StalePinWarning, match="7"):
        pinned.compile(build(torch.device("cpu"), n_layers=1).model)


def test_missing_and_corrupt_pins(tmp_path: Path) -> None:
    with pytest.raises(PinnedConfigError, match="no such pinned config"):
        budgettune.load_pinned(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PinnedConfigError, match="not a readable"):
        budgettune.load_pinned(bad)
    bad.write_text(json.dumps({"schema_version": 2, "spec": {}}))
    with pytest.raises(PinnedConfigError, match="schema version 2"):
        budgettune.load_pinned(bad)


def test_example_training_loop_runs_with_a_pin(tmp_path: Path) -> None:
    path = _pin(tmp_path, SPEC)
    spec = importlib.util.spec_from_file_location("train_with_pinned", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    losses = module.main(str(path), steps=3)  # the third is measured against the pin
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def _timed(ms: float):
    from dataclasses import replace

    from storage_samples import ok_result

    result = ok_result()
    assert result.measurement is not None
    return replace(result, measurement=replace(result.measurement, step_time_ms=ms))


def test_pin_slowdown_uses_the_re_measured_baseline_median() -> None:
    from budgettune.pinning import Candidate, build_pin
    from budgettune.storage.user_attrs import TrialRecord
    from budgettune.study.pin import pin_scope, reference_trial
    from budgettune.study.space import SearchSpace
    from budgettune.study.spec import SearchSpec

    search = SearchSpec(
        workload="builtin:tiny-gpt",
        max_mem_bytes=15_000_000_000,
        num_trials=4,
        study_name="s",
        space=SearchSpace.for_device("cpu"),
    )
    candidate = Candidate(trial_number=3, spec=SPEC, step_time_ms=60.0, peak_bytes=14_050_000_000)
    attrs = {
        "spec": TrialSpec().to_json_dict(),
        "peak_device_bytes": 19_000_000_000,
        "step_time_ms": 40.0,  # one noisy trial measurement
        "peak_phase": "backward",
    }
    pins = [_timed(66.0), _timed(63.0), _timed(70.0)]
    scope, reference = pin_scope(search), reference_trial(TrialRecord.from_attrs(attrs), "device")
    doc = build_pin(
        scope=scope, candidate=candidate, reverify_results=pins, baseline=reference, trials=4,
        baseline_results=[_timed(61.0), _timed(59.0), _timed(60.0)],
    ).to_json_dict()  # fmt: skip
    baseline = doc["baseline"]
    assert (baseline["step_time_ms"], baseline["runs"], baseline["trial_step_time_ms"]) == (
        60.0,
        3,
        40.0,
    )
    assert baseline["slowdown"] == pytest.approx(66.0 / 60.0 - 1)
    # without re-measurements (all failed) the trial's figure is the baseline
    alone = build_pin(
        scope=scope, candidate=candidate, reverify_results=pins, baseline=reference, trials=4
    ).to_json_dict()["baseline"]
    assert (alone["step_time_ms"], alone["runs"]) == (40.0, 0)
    assert alone["slowdown"] == pytest.approx(66.0 / 40.0 - 1)
