"""Issue 33's offload knob on CPU: the spec, the search space and study keys, the step and the
job that apply it (blocks compiled one by one, the hooks around them, nothing else changed),
the host limit in the search's notion of "fits", and what the pin and `show` say of it.

On CPU the "host" is the same memory, so nothing is saved: these tests prove the wiring and
the bookkeeping; the GPU figures are in ``benchmarks/results/``.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from rich.console import Console
from storage_samples import ok_result, pin_document
from torch import nn

from budgettune.errors import SpecError, UsageError
from budgettune.pinning import Candidate, PinDocument, choose_pin, measured_violation_bytes
from budgettune.pinning.choose import PinScope, ReferenceTrial, build_pin
from budgettune.present.tables import pin_table, result_table
from budgettune.study.study import study_attrs
from budgettune.study.study_file import build_search_spec
from budgettune.trial.offload import ActivationOffload, is_offloaded
from budgettune.trial.recompute import apply_to_model, prepare
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec
from budgettune.workloads.tiny_gpt import build as tiny_gpt

EAGER = TrialSpec(compile_mode="eager")
COMPILED = TrialSpec(compile_backend="aot_eager_decomp_partition")


def test_the_knob_round_trips_renders_and_refuses_a_negative_stride() -> None:
    spec = COMPILED.replace(offload_every=2, block_ac_every=4)
    assert TrialSpec.from_json_dict(json.loads(json.dumps(spec.to_json_dict()))) == spec
    assert "offload every 2" in spec.describe() and "offload" not in COMPILED.describe()
    with pytest.raises(SpecError, match="offload_every must be an integer from 0 to"):
        TrialSpec(offload_every=-1)
    knob = KNOB_BY_NAME["offload_every"]
    assert knob.applied_by == "offload" and knob.space_default == (0,)
    assert knob.flag == "--offload-every" and knob.plural_flag == "--offload-every"


def test_the_space_and_the_host_limit_of_a_search() -> None:
    plain = build_search_spec({"max_mem": "1GB"}, default_device="cpu")
    assert not plain.offload_searched and "max_host_mem_bytes" not in study_attrs(plain)
    assert plain.host_limit_bytes > 0  # half the host's memory by default
    searched = build_search_spec(
        {"max_mem": "1GB", "max_host_mem": "3GB", "space": {"offload_every": [0, 2]}},
        default_device="cpu",
    )
    assert searched.offload_searched and searched.space.offload_every == (0, 2)
    # not a study attr (its default differs per host): the stored search spec holds it
    assert "max_host_mem_bytes" not in study_attrs(searched)
    assert searched.to_json_dict()["max_host_mem_bytes"] == 3_000_000_000
    fixed = build_search_spec(
        {"max_mem": "1GB", "fix": {"offload_every": 1}}, default_device="cpu"
    )
    assert fixed.offload_searched
    with pytest.raises(UsageError, match="--max-host-mem"):
        build_search_spec({"max_mem": "1GB", "max_host_mem": "12"}, default_device="cpu")


def _workload():
    torch.manual_seed(0)
    return tiny_gpt(torch.device("cpu"), n_layers=4, batch_size=2, seq_len=128)


def _first_step(spec: TrialSpec):
    step = prepare(_workload(), spec, torch.device("cpu"))
    loss = step.forward_loss()
    step.backward(loss)
    grads = [p.grad.clone() for p in step.model.parameters() if p.grad is not None]
    return step, loss.item(), grads


@pytest.mark.parametrize("base", [EAGER, COMPILED], ids=["eager", "compiled"])
def test_the_step_offloads_every_kth_block_and_computes_the_same(base: TrialSpec) -> None:
    torch._dynamo.reset()
    _, plain_loss, plain_grads = _first_step(base)
    step, loss, grads = _first_step(base.replace(offload_every=2))
    blocks = list(step.model.layers)  # type: ignore[arg-type]
    assert [is_offloaded(b) for b in blocks] == [False, True, False, True]
    assert step.offload is not None and step.offload.device_types == ("cpu",)
    ledger = step.offload.ledger
    assert ledger.moved_bytes > 1 << 20 and ledger.held_bytes == 0  # all back after backward
    assert step.compiled is step.model  # compiled: block by block, not the whole model
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, plain_grads, strict=True))
    torch._dynamo.reset()


def test_the_job_applies_it_in_the_trials_order_and_keeps_the_state_dict_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch._dynamo.reset()
    entered = []
    real_enter = ActivationOffload.__enter__

    def enter(self: ActivationOffload) -> ActivationOffload:
        entered.append(self)
        return real_enter(self)

    monkeypatch.setattr(ActivationOffload, "__enter__", enter)
    model = _workload().model
    keys = list(model.state_dict())
    spec = COMPILED.replace(offload_every=1, block_ac_every=2, block_ac_policy="op")
    wrapped = apply_to_model(model, spec)
    assert list(wrapped.module.state_dict()) == keys  # type: ignore[operator]
    tokens = torch.randint(0, 4096, (2, 64))
    wrapped(tokens).float().square().mean().backward()
    assert len(entered) == 4  # every block's forward, once
    assert all(is_offloaded(b) for b in model.layers)  # type: ignore[union-attr]
    torch._dynamo.reset()


def test_a_model_without_blocks_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match="offload_every needs repeated blocks"):
        apply_to_model(nn.Linear(4, 4), EAGER.replace(offload_every=1))


def _measured(*, host: int, offload: int = 5_000_000, peak: int = 90) -> object:
    result = ok_result()
    assert result.measurement is not None
    m = dataclasses.replace(
        result.measurement,
        peak_device_bytes=peak,
        host_peak_bytes=host,
        offload_bytes=offload,
    )
    return dataclasses.replace(result, measurement=m)


def test_over_the_host_limit_does_not_fit_in_the_search_or_the_pin() -> None:
    within, over = _measured(host=900), _measured(host=1_500)
    assert within.measurement is not None and over.measurement is not None  # type: ignore[attr-defined]
    fits = {"limit_bytes": 100, "mem_metric": "device", "margin": 0.0}
    assert measured_violation_bytes(within.measurement, host_limit_bytes=1000, **fits) < 0  # type: ignore[attr-defined]
    assert measured_violation_bytes(over.measurement, host_limit_bytes=1000, **fits) == 500  # type: ignore[attr-defined]
    assert measured_violation_bytes(over.measurement, host_limit_bytes=None, **fits) < 0  # type: ignore[attr-defined]
    spec = TrialSpec(offload_every=1)
    fast = Candidate(trial_number=0, spec=spec, step_time_ms=10.0, peak_bytes=90)
    slow = Candidate(trial_number=1, spec=spec, step_time_ms=20.0, peak_bytes=90)
    chosen = choose_pin(
        [fast, slow],
        {0: [over], 1: [within]},
        host_limit_bytes=1000,
        **fits,  # type: ignore[list-item]
    )
    assert chosen is not None and chosen[0] is slow


def _offloading_pin() -> PinDocument:
    scope = PinScope(
        study_name="s", workload="builtin:tiny-gpt", workload_options={}, device="cuda",
        limit_bytes=10**9, mem_metric="device", margin=0.03, world_size=1,
    )  # fmt: skip
    spec = TrialSpec(offload_every=2)
    run = _measured(host=3_000_000_000, offload=2_500_000_000, peak=80)
    best = ReferenceTrial(
        spec=TrialSpec(block_ac_every=1), peak_bytes=70, peak_device_bytes=70,
        step_time_ms=50.0, peak_phase="backward",
    )  # fmt: skip
    return build_pin(
        scope=scope,
        candidate=Candidate(trial_number=3, spec=spec, step_time_ms=62.9, peak_bytes=80),
        reverify_results=[run],  # type: ignore[list-item]
        baseline=None,
        trials=5,
        no_offload=best,
        no_offload_results=[],
        host_limit_bytes=64 * 10**9,
    )


def test_the_pin_says_what_offload_moves_and_costs_against_the_best_without_it() -> None:
    pin = _offloading_pin()
    run = _measured(host=3_000_000_000, offload=2_500_000_000, peak=80)
    data = pin.to_json_dict()
    assert data["measured"]["offload_bytes"] == 2_500_000_000
    assert data["measured"]["host_peak_worst_bytes"] == 3_000_000_000
    assert data["host_limit_bytes"] == 64 * 10**9
    assert data["no_offload"]["slowdown"] == pytest.approx(62.9 / 50.0 - 1)
    assert PinDocument.from_json_dict(data) == pin
    console = Console(width=300, record=True)
    console.print(pin_table(pin))
    text = console.export_text()
    assert "2.50 GB (2.33 GiB) to host memory and back per step" in text
    assert "host memory held 3.00 GB (2.79 GiB) at most; limit 64.00 GB" in text
    assert "vs best without offload  +25.8%" in text
    # a pin that does not offload keeps the document it always had
    plain = dataclasses.replace(pin, spec=TrialSpec())
    assert "no_offload" not in plain.to_json_dict()
    console = Console(width=300, record=True)
    console.print(result_table(run))  # type: ignore[arg-type]
    assert "offloaded" in console.export_text()


def test_op_offload_turns_the_partitioners_offload_on_with_its_marking_pass() -> None:
    import torch._functorch.config as functorch_config

    from budgettune.trial.partitioner import (
        COMPILED_OFFLOAD_SETTINGS,
        functorch_settings,
        mark_saved_for_offload,
    )

    spec = COMPILED.replace(block_ac_every=2, block_ac_policy="op_offload")
    on = functorch_settings(spec, functorch_config)
    assert on[COMPILED_OFFLOAD_SETTINGS[0]] is True
    assert on["joint_custom_pass"] is mark_saved_for_offload
    # no CUDA here: the side-stream variants (CUDA streams) stay off, the copies synchronous
    assert not set(COMPILED_OFFLOAD_SETTINGS[1:]) & set(on)
    off = functorch_settings(spec.replace(block_ac_policy="op"), functorch_config)
    assert not set(COMPILED_OFFLOAD_SETTINGS) & set(off) and "joint_custom_pass" not in off
    assert spec.partition_variant() != spec.replace(block_ac_policy="op").partition_variant()


def test_op_offload_is_refused_eager_and_where_torch_lacks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import budgettune.trial.partitioner as partitioner

    with pytest.raises(SpecError, match="needs torch.compile"):
        EAGER.replace(block_ac_every=1, block_ac_policy="op_offload")
    with pytest.raises(UsageError, match="op_offload needs torch.compile"):
        build_search_spec(
            {"max_mem": "1GB", "space": {"compile_modes": ["eager", "default"],
                                         "block_ac_policies": ["op_offload"]}},
            default_device="cpu",
        )  # fmt: skip
    spec = COMPILED.replace(block_ac_every=1, block_ac_policy="op_offload")
    partitioner.check_spec_supported(spec, "cpu")  # torch 2.13 here has it
    monkeypatch.setattr(
        partitioner, "COMPILED_OFFLOAD_SETTINGS", ("enable_activation_offloading_gone",)
    )
    with pytest.raises(SpecError, match="has no compiled activation offloading .*_gone"):
        partitioner.check_spec_supported(spec, "cpu")


def test_a_compiled_step_with_op_offload_moves_what_op_saves_and_computes_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._functorch._activation_offloading.activation_offloading as offloading

    chosen: list[bool] = []
    real = offloading.choose_offload_sets

    def spy(*args: object, **kwargs: object) -> bool:
        chosen.append(real(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(offloading, "choose_offload_sets", spy)
    torch._dynamo.reset()
    _, op_loss, op_grads = _first_step(COMPILED.replace(block_ac_every=1, block_ac_policy="op"))
    assert chosen == []  # op alone: the partitioner's offloading is off
    torch._dynamo.reset()
    spec = COMPILED.replace(block_ac_every=1, block_ac_policy="op_offload")
    _, loss, grads = _first_step(spec)
    assert chosen == [True]  # the marked nodes were found and moved
    assert loss == pytest.approx(op_loss, rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, op_grads, strict=True))
    torch._dynamo.reset()


def test_the_dashboards_note_says_it_too() -> None:
    from budgettune.present.dashboard_views import study_note

    note = study_note(
        study_name="s", search={"max_mem_bytes": 10**9}, points=[], num_failed=0,
        pin=_offloading_pin(),
    )  # fmt: skip
    assert "| offloaded per step | 2.50 GB (2.33 GiB) to host memory and back |" in note
    assert "| slowdown vs best without offload | +25.8% (50.00 ms" in note


def test_a_trainers_model_gets_the_offload_in_place(tmp_path) -> None:
    """`pinned.compile(model, in_place=True)` (the transformers and Lightning callbacks): the
    model stays the same object with the same keys, its blocks compiled one by one with the
    hooks around them, its forward scoped but not compiled as a whole."""
    from budgettune.pinning import load_pinned
    from budgettune.trial.scoped_forward import scoped_forward_of

    torch._dynamo.reset()
    path = tmp_path / "pin.json"
    path.write_text(json.dumps(pin_document(COMPILED.replace(offload_every=2))))
    model = _workload().model
    keys = list(model.state_dict())
    assert load_pinned(path, warn=False).compile(model, in_place=True) is model
    assert list(model.state_dict()) == keys
    assert [is_offloaded(b) for b in model.layers] == [False, True, False, True]  # type: ignore[union-attr]
    model(torch.randint(0, 4096, (2, 64))).float().square().mean().backward()
    state = scoped_forward_of(model)
    assert state is not None and state.calls == 1
    torch._dynamo.reset()


def test_a_compiled_offload_pin_says_its_bytes_are_not_counted() -> None:
    spec = COMPILED.replace(block_ac_every=1, block_ac_policy="op_offload")
    assert spec.offloads and spec.compiled_offload and not COMPILED.offloads
    pin = dataclasses.replace(_offloading_pin(), spec=spec)
    pin = dataclasses.replace(pin, measured=dataclasses.replace(pin.measured, offload_bytes=0))
    assert "no_offload" in pin.to_json_dict()  # an offloading pin: compared without offload
    console = Console(width=300, record=True)
    console.print(pin_table(pin))
    assert "not counted (the compiled offload) to host memory" in console.export_text()
    searched = build_search_spec(
        {"max_mem": "1GB", "space": {"block_ac_policies": ["full", "op_offload"]}},
        default_device="cpu",
    )
    assert searched.offload_searched


def test_the_hooks_work_under_inductor_which_checks_saved_strides() -> None:
    """Inductor's backward asserts the strides of what it saved: the host copy keeps them
    (attention saves strided tensors; a contiguous copy failed here), and views into a larger
    tensor stay on the device."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    step = prepare(tiny_gpt(torch.device("cpu")), TrialSpec(offload_every=2), torch.device("cpu"))
    for _ in range(2):
        loss = step.forward_loss()
        step.backward(loss)
        step.optimizer_step()
    assert step.offload is not None and step.offload.ledger.moved_bytes > 1 << 20
    assert torch.isfinite(loss)
    torch._dynamo.reset()


def test_the_models_own_tensors_and_views_into_larger_ones_stay() -> None:
    offload = ActivationOffload(min_bytes=0, device_types=("cpu",))
    table = torch.randn(64, 64)  # a buffer every block saves (a RoPE table)
    offload.keep([table])
    assert not offload.wants(table) and not offload.wants(table[:32])
    qkv = torch.randn(8, 3, 64)
    assert not offload.wants(qkv[:, 0])  # a view into a larger tensor: not dense
    assert offload.wants(qkv.transpose(0, 1))  # dense in another order: moved, strides kept
    packed = offload.pack(qkv.transpose(0, 1))
    back = offload.unpack(packed)
    assert back.stride() == qkv.transpose(0, 1).stride() and torch.equal(back, qkv.transpose(0, 1))


def test_offload_is_refused_with_cuda_graphs_and_not_sampled_there() -> None:
    with pytest.raises(SpecError, match="CUDA graphs overwrite their memory"):
        TrialSpec(offload_every=1, compile_mode="reduce-overhead")
    knob = KNOB_BY_NAME["offload_every"]
    assert not knob.relevant(TrialSpec(compile_mode="max-autotune"))
    assert knob.relevant(TrialSpec(compile_mode="max-autotune-no-cudagraphs"))
    assert not knob.relevant(EAGER.replace(block_ac_every=1))  # checkpoint's hooks hold all
    assert knob.relevant(EAGER.replace(block_ac_every=2))


def test_the_parent_refuses_op_offload_on_a_torch_without_it_before_any_trial(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`budgettune trial` and `search` probe torch in a short child first (as for op names)."""
    from budgettune.trial.launcher import check_ops_exist

    check_ops_exist([], compiled_offload=True)  # torch 2.13 here has it
    shim = tmp_path / "sitecustomize.py"  # the probe child's torch without the setting
    shim.write_text(
        "import torch._functorch.config as c\n"
        "c._config.pop('enable_activation_offloading', None)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    with pytest.raises(SpecError, match="has no compiled activation offloading"):
        check_ops_exist([], compiled_offload=True)


def test_the_search_leaves_out_op_ac_below_budget_one_with_offload() -> None:
    """Compiled block by block, an op-policy block at budget < 1 failed in AOTAutograd on torch
    2.13 ("expected all tensors_saved_with_vc_check to be Tensors": found by a CPU search with
    offload in the space, which then excluded the op policy for good); budget 1.0 and the full
    policy run."""
    knob = KNOB_BY_NAME["offload_every"]
    op = COMPILED.replace(block_ac_every=4, block_ac_policy="op")
    assert not knob.relevant(op.replace(activation_memory_budget=0.58))
    assert knob.relevant(op) and knob.relevant(op.replace(block_ac_policy="full"))
    assert knob.relevant(COMPILED.replace(activation_memory_budget=0.3))
