"""Regional compilation as a knob (issue 44): ``compile_scope`` blocks compiles one repeated
block, reused by its copies, the rest of the model eager; the trial's step, the job's
`apply_to_model` and a trainer's in-place compile all apply it the same way, and the search
samples it only where it can run. On CPU with the codegen-free backend; the GPU figures are in
``benchmarks/results/``.
"""

from __future__ import annotations

import json

import pytest
import torch
from storage_samples import pin_document
from torch import nn
from torch._dynamo.utils import counters

from budgettune.errors import SpecError
from budgettune.integrations.torchtitan import torchtitan_config
from budgettune.pinning import PinnedConfig, load_pinned
from budgettune.study.study_file import build_search_spec
from budgettune.trial.recompute import apply_to_model, prepare
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec
from budgettune.workloads.tiny_gpt import build as tiny_gpt

COMPILED = TrialSpec(compile_backend="aot_eager_decomp_partition")
BLOCKS = COMPILED.replace(compile_scope="blocks")


def _compiled_in_place(module: nn.Module) -> bool:
    return hasattr(module.forward, "_torchdynamo_orig_callable")


def _workload(layers: int = 4):
    torch.manual_seed(0)
    return tiny_gpt(torch.device("cpu"), n_layers=layers, batch_size=2, seq_len=64)


def test_the_knob_round_trips_renders_and_is_listed_for_a_search() -> None:
    assert TrialSpec.from_json_dict(json.loads(json.dumps(BLOCKS.to_json_dict()))) == BLOCKS
    assert "compiled per block" in BLOCKS.describe()
    assert "per block" not in COMPILED.describe()
    assert BLOCKS.compiles_blocks and not COMPILED.compiles_blocks
    assert not TrialSpec(compile_mode="eager", compile_scope="blocks").compiles_blocks
    assert COMPILED.replace(offload_every=2).compiles_blocks  # offload's hooks need it so
    knob = KNOB_BY_NAME["compile_scope"]
    assert knob.applied_by == "compile" and knob.space_default == ("model",)
    assert knob.flag == "--compile-scope" and knob.plural_flag == "--compile-scopes"
    with pytest.raises(SpecError, match="compile_scope"):
        TrialSpec(compile_scope="layers")  # type: ignore[arg-type]
    search = build_search_spec(
        {"max_mem": "1GB", "space": {"compile_scopes": ["model", "blocks"]}},
        default_device="cpu",
    )
    assert search.space.compile_scopes == ("model", "blocks")


def test_the_search_samples_it_only_where_blocks_compile_one_by_one() -> None:
    """An op-policy block below budget 1 fails in AOTAutograd compiled block by block on torch
    2.13 (as offload found); eager has nothing to scope; offload compiles per block anyway."""
    knob = KNOB_BY_NAME["compile_scope"]
    op = COMPILED.replace(block_ac_every=1, block_ac_policy="op")
    assert knob.relevant(COMPILED.replace(activation_memory_budget=0.3))
    assert knob.relevant(op) and knob.relevant(op.replace(block_ac_policy="full"))
    assert not knob.relevant(op.replace(activation_memory_budget=0.5))
    assert not knob.relevant(TrialSpec(compile_mode="eager"))
    assert not knob.relevant(COMPILED.replace(offload_every=1))


def test_the_step_compiles_one_block_for_all_and_computes_the_same() -> None:
    results = {}
    for spec in (COMPILED, BLOCKS):
        torch._dynamo.reset()
        counters.clear()
        step = prepare(
            _workload(), spec.replace(activation_memory_budget=0.5), torch.device("cpu")
        )
        loss = step.forward_loss()
        step.backward(loss)
        grads = [p.grad.clone() for p in step.model.parameters() if p.grad is not None]
        blocks = list(step.model.layers)  # type: ignore[arg-type]
        results[spec.compile_scope] = (loss.item(), grads, step, blocks)
        assert counters["stats"]["unique_graphs"] == 1
    loss, grads, step, blocks = results["blocks"]
    assert step.compiled is step.model  # the model itself is not compiled as a whole
    assert all(_compiled_in_place(b) for b in blocks)
    _, _, whole, whole_blocks = results["model"]
    assert whole.compiled is not whole.model and not any(map(_compiled_in_place, whole_blocks))
    assert loss == pytest.approx(results["model"][0], rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, results["model"][1]))
    torch._dynamo.reset()


def test_the_job_applies_it_as_the_trial_did_and_keeps_the_state_dict_keys() -> None:
    torch._dynamo.reset()
    model = _workload().model
    keys = list(model.state_dict())
    wrapped = apply_to_model(model, BLOCKS.replace(block_ac_every=2))
    assert list(wrapped.module.state_dict()) == keys  # type: ignore[operator]
    assert wrapped._compiled[0] is model  # type: ignore[index]
    assert all(_compiled_in_place(b) for b in model.layers)  # type: ignore[union-attr]
    wrapped(torch.randint(0, 4096, (2, 32))).float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    torch._dynamo.reset()


def test_a_trainers_model_gets_its_blocks_compiled_in_place(tmp_path) -> None:
    torch._dynamo.reset()
    path = tmp_path / "pin.json"
    path.write_text(json.dumps(pin_document(BLOCKS)))
    model = _workload().model
    assert load_pinned(path, warn=False).compile(model, in_place=True) is model
    assert all(_compiled_in_place(b) for b in model.layers)  # type: ignore[union-attr]
    assert not hasattr(type(model).forward, "_torchdynamo_orig_callable")
    model(torch.randint(0, 4096, (2, 32))).float().square().mean().backward()
    torch._dynamo.reset()


def test_a_model_without_blocks_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match="compile_scope blocks needs repeated blocks"):
        apply_to_model(nn.Linear(4, 4), BLOCKS)
    apply_to_model(nn.Linear(4, 4), COMPILED)  # the whole-model compile needs none


def test_torchtitan_says_a_whole_model_compile_is_not_its_way(tmp_path) -> None:
    """torchtitan compiles each block (``compile.components``), never the whole model."""

    def config(spec: TrialSpec):
        path = tmp_path / f"{spec.compile_scope}.json"
        path.write_text(json.dumps(pin_document(spec.replace(optimizer_impl="fused"))))
        pinned = load_pinned(path, warn=False)
        assert isinstance(pinned, PinnedConfig)
        return torchtitan_config(pinned)

    assert any("whole model" in text for text in config(COMPILED).not_expressed)
    assert not any("whole model" in text for text in config(BLOCKS).not_expressed)


def test_a_search_of_one_scope_measures_its_baselines_in_it_too() -> None:
    """``--compile-scopes blocks`` says how the job compiles: the baselines, the probes and the
    structured points (all made from `as_given`) compile block by block too, so each "vs
    baseline" compares like with like and no reference pays the whole-model compile."""
    from budgettune.study.study import as_given, baseline_specs

    def given(scopes: list[str] | None, **extra: object):
        space: dict[str, object] = {"compile_backend": "aot_eager_decomp_partition"}
        if scopes is not None:
            space["compile_scopes"] = scopes
        search = build_search_spec(
            {"max_mem": "1GB", "num_trials": 20, "space": space, **extra}, default_device="cpu"
        )
        return search, as_given(search)

    search, spec = given(["blocks"])
    assert spec.compile_scope == "blocks"
    assert {s.compile_scope for _, s in baseline_specs(search)} == {"blocks"}
    assert given(["model", "blocks"])[1].compile_scope == "model"  # as the user's job runs
    assert given(None)[1].compile_scope == "model"
    assert given(["blocks"], fix={"compile_scope": "model"})[1].compile_scope == "model"
