"""recompute.py: every knob reaches torch, and nothing leaks out of its scope."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._functorch.partitioners as partitioners
from recompute_models import tiny_lm_workload

from budgettune.errors import SpecError
from budgettune.trial import block_ac, recompute, saved_activations
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

CPU = torch.device("cpu")
FAST = {"compile_backend": "aot_eager_decomp_partition"}


def saved_stats(workload=None, **knobs) -> tuple[int, int]:
    """Saved-for-backward (count, bytes) of one forward of a fresh tiny LM under the knobs."""
    torch._dynamo.reset()
    workload = workload or tiny_lm_workload(layers=2)
    step = recompute.prepare(workload, TrialSpec(**{**FAST, **knobs}), CPU)
    stats = saved_activations.saved_activation_stats(step)
    print(f"saved activations {knobs}: {stats[0]} tensors, {stats[1]} bytes")
    return stats


@pytest.fixture(scope="module")
def baseline() -> tuple[int, int]:
    return saved_stats()


# --------------------------------------------------------------------------- ops and checks


def test_resolve_ops_gives_packets() -> None:
    add, convert = recompute.resolve_ops(["aten.add", "prims.convert_element_type"])
    assert add is torch.ops.aten.add
    assert convert is torch.ops.prims.convert_element_type


@pytest.mark.parametrize("name", ["aten.nope", "aten.add.Tensor", "foo.add", "aten"])
def test_resolve_ops_unknown_is_one_line_spec_error(name: str) -> None:
    with pytest.raises(SpecError, match="unknown op") as info:
        recompute.resolve_ops([name])
    assert "\n" not in str(info.value) and "aten.add" in str(info.value)


def test_profile_estimator_needs_cuda() -> None:
    spec = TrialSpec(runtime_estimator="profile", **FAST)
    with pytest.raises(SpecError, match="needs CUDA"):
        recompute.check_spec_supported(spec, "cpu")
    recompute.check_spec_supported(spec, "cuda")
    recompute.check_spec_supported(spec.replace(compile_mode="eager"), "cpu")


def test_ilp_needs_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TrialSpec(knapsack_solver="ilp")
    recompute.check_spec_supported(spec, "cpu")  # scipy is in the dev environment
    real_find_spec = recompute.importlib.util.find_spec
    monkeypatch.setattr(
        recompute.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "scipy" else real_find_spec(name, *a),
    )
    with pytest.raises(SpecError, match="pip install scipy"):
        recompute.check_spec_supported(spec, "cpu")


def test_unknown_op_fails_in_prepare_before_compiling() -> None:
    spec = TrialSpec(recompute_ops_added=("aten.nope",), **FAST)
    with pytest.raises(SpecError, match="aten.nope"):
        recompute.prepare(tiny_lm_workload(layers=1), spec, CPU)


# --------------------------------------------------------------------------- scoped settings


def test_partitioner_settings_scopes_config_and_op_list() -> None:
    original = partitioners.get_default_op_list
    before = {key: getattr(functorch_config, key) for key in recompute._CONFIG_KEYS}
    spec = TrialSpec(
        activation_memory_budget=0.3,
        knapsack_solver="greedy",
        runtime_estimator="profile",
        recompute_ops_removed=("aten.add",),
        recompute_ops_added=("aten.mm",),
    )
    with recompute.partitioner_settings(spec):
        assert functorch_config.activation_memory_budget == 0.3
        assert functorch_config.activation_memory_budget_solver == "greedy"
        assert functorch_config.activation_memory_budget_runtime_estimator == "profile"
        op_types = partitioners.get_default_op_list()
        assert torch.ops.aten.add not in op_types.recomputable_ops
        assert torch.ops.aten.add not in op_types.fusible_ops
        assert torch.ops.aten.mm in op_types.recomputable_ops
        assert torch.ops.aten.mm in op_types.fusible_ops
        assert torch.ops.aten.mul in op_types.recomputable_ops
    assert partitioners.get_default_op_list is original
    assert torch.ops.aten.add in original().recomputable_ops
    assert torch.ops.aten.mm not in original().recomputable_ops
    assert {key: getattr(functorch_config, key) for key in recompute._CONFIG_KEYS} == before


def test_partitioner_settings_restores_after_an_exception() -> None:
    original = partitioners.get_default_op_list
    spec = TrialSpec(activation_memory_budget=0.1, recompute_ops_added=("aten.mm",))
    with pytest.raises(KeyError):
        with recompute.partitioner_settings(spec):
            raise KeyError("boom")
    assert partitioners.get_default_op_list is original
    assert functorch_config.activation_memory_budget == 1.0


def test_solver_and_estimator_reach_the_partitioner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, str, str]] = []
    real_greedy = partitioners.greedy_knapsack

    def spy(*args, **kwargs):
        seen.append(
            (
                functorch_config.activation_memory_budget,
                functorch_config.activation_memory_budget_solver,
                functorch_config.activation_memory_budget_runtime_estimator,
            )
        )
        return real_greedy(*args, **kwargs)

    monkeypatch.setattr(partitioners, "greedy_knapsack", spy)
    greedy, _ = saved_stats(activation_memory_budget=0.2, knapsack_solver="greedy")
    assert seen and set(seen) == {(0.2, "greedy", "flops")}
    assert functorch_config.activation_memory_budget_solver == "dp"


# --------------------------------------------------------------------------- knobs change saving


def test_lower_budget_saves_less(baseline: tuple[int, int]) -> None:
    half = saved_stats(activation_memory_budget=0.5)
    low = saved_stats(activation_memory_budget=0.2)
    assert baseline[1] > half[1] > low[1]
    assert low[1] < baseline[1] / 2


def test_removing_add_changes_what_is_saved(baseline: tuple[int, int]) -> None:
    assert saved_stats(recompute_ops_removed=("aten.add",)) != baseline


def test_adding_mm_saves_less_and_does_not_leak(baseline: tuple[int, int]) -> None:
    original = partitioners.get_default_op_list
    with_mm = saved_stats(recompute_ops_added=("aten.mm",))
    assert with_mm[1] < baseline[1]
    assert partitioners.get_default_op_list is original
    assert saved_stats() == baseline  # the next spec, without overrides, saves the original set


# --------------------------------------------------------------------------- block AC


def test_apply_block_ac_wraps_every_kth_block() -> None:
    assert block_ac.apply_block_ac(tiny_lm_workload().blocks, 0, "full") == 0
    assert block_ac.apply_block_ac(tiny_lm_workload().blocks, 1, "full") == 4
    blocks = tiny_lm_workload().blocks
    assert block_ac.apply_block_ac(blocks, 2, "op") == 2
    assert [hasattr(b, block_ac._BLOCK_AC_MARK) for b in blocks] == [False, True, False, True]
    assert block_ac.apply_block_ac(tiny_lm_workload().blocks, 3, "full") == 1
    assert block_ac.apply_block_ac(tiny_lm_workload().blocks, 5, "full") == 0
    with pytest.raises(SpecError, match="already wrapped"):
        block_ac.apply_block_ac(blocks, 1, "full")
    with pytest.raises(SpecError, match="block_ac_policy"):
        block_ac.apply_block_ac(blocks, 1, "selective")


def test_block_ac_saves_less_under_compile(baseline: tuple[int, int]) -> None:
    every_2 = saved_stats(block_ac_every=2)
    every_1 = saved_stats(block_ac_every=1)
    op_policy = saved_stats(block_ac_every=1, block_ac_policy="op")
    assert baseline[1] > every_2[1] > every_1[1]
    assert baseline[1] > op_policy[1] > every_1[1]  # op saves mm/attention, full saves none


@pytest.mark.parametrize("policy", ["full", "op"])
def test_block_ac_keeps_gradients_eagerly(policy: str) -> None:
    def grads(every: int) -> list[torch.Tensor]:
        workload = tiny_lm_workload(layers=2)
        block_ac.apply_block_ac(workload.blocks, every, policy)
        workload.loss(workload.model, workload.batch).backward()
        return [p.grad for p in workload.model.parameters()]

    for plain, checkpointed in zip(grads(0), grads(1), strict=True):
        torch.testing.assert_close(plain, checkpointed)


def test_prepare_finds_blocks_and_requires_them() -> None:
    workload = tiny_lm_workload(blocks=False)
    spec = TrialSpec(block_ac_every=1, compile_mode="eager")
    step = recompute.prepare(workload, spec, CPU)
    assert all(hasattr(b, block_ac._BLOCK_AC_MARK) for b in step.model.layers)
    flat = tiny_lm_workload(blocks=False)
    flat.model.layers = torch.nn.Sequential(*flat.model.layers)  # a Sequential is found too
    step = recompute.prepare(flat, spec, CPU)
    assert all(hasattr(b, block_ac._BLOCK_AC_MARK) for b in step.model.layers)
    linear = dataclasses.replace(flat, model=torch.nn.Linear(2, 2), blocks=None)
    with pytest.raises(SpecError, match="repeated blocks"):
        recompute.prepare(linear, spec, CPU)


# --------------------------------------------------------------------------- optimizer


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_sets_the_flag(impl: str) -> None:
    workload = tiny_lm_workload(
        layers=1,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.05),
    )
    spec = TrialSpec(optimizer_impl=impl, compile_mode="eager")
    step = recompute.prepare(workload, spec, CPU)
    other = "fused" if impl == "foreach" else "foreach"
    assert type(step.optimizer) is torch.optim.AdamW
    for group in step.optimizer.param_groups:
        assert group[impl] is True and not group[other]
        assert group["lr"] == 3e-4 and group["weight_decay"] == 0.05
    assert step.optimizer.defaults[impl] is True
    before = [p.detach().clone() for p in step.model.parameters()]
    step.run_step()  # fused AdamW runs on CPU in torch >= 2.4
    assert any(not torch.equal(a, p) for a, p in zip(before, step.model.parameters()))


def test_default_optimizer_and_as_written() -> None:
    step = recompute.prepare(tiny_lm_workload(layers=1), TrialSpec(compile_mode="eager"), CPU)
    assert type(step.optimizer) is torch.optim.AdamW
    assert step.optimizer.defaults["lr"] == 1e-4
    assert step.optimizer.defaults["fused"] is None
    assert recompute.rebuild_optimizer(step.optimizer, "as_written") is step.optimizer


class _PlainSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        return None


@pytest.mark.parametrize(
    ("factory", "impl", "name"),
    [
        (lambda params: torch.optim.LBFGS(params), "foreach", "LBFGS"),
        (lambda params: _PlainSGD(params), "fused", "_PlainSGD"),
    ],
)
def test_optimizer_without_the_flag_is_a_spec_error(factory, impl: str, name: str) -> None:
    workload = tiny_lm_workload(layers=1, optimizer=factory)
    with pytest.raises(SpecError, match=name):
        recompute.prepare(workload, TrialSpec(optimizer_impl=impl, compile_mode="eager"), CPU)


# --------------------------------------------------------------------------- compile, pinning


def test_compile_model_modes() -> None:
    model = torch.nn.Linear(2, 2)
    assert recompute.compile_model(model, TrialSpec(compile_mode="eager")) is model
    compiled = recompute.compile_model(model, TrialSpec(**FAST))
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)


def test_apply_to_model_scopes_settings_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._dynamo.reset()
    budgets: list[float] = []
    real_choose = partitioners.choose_saved_values_set

    def spy(joint_graph, node_info, memory_budget=1, **kwargs):
        budgets.append(functorch_config.activation_memory_budget)
        return real_choose(joint_graph, node_info, memory_budget, **kwargs)

    monkeypatch.setattr(partitioners, "choose_saved_values_set", spy)
    workload = tiny_lm_workload(layers=2)
    expected = workload.loss(workload.model, workload.batch)
    spec = TrialSpec(activation_memory_budget=0.4, block_ac_every=2, **FAST)
    wrapped = recompute.apply_to_model(workload.model, spec)
    assert wrapped is not workload.model and wrapped.module is workload.model
    loss = workload.loss(wrapped, workload.batch)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    assert budgets and set(budgets) == {0.4}
    assert functorch_config.activation_memory_budget == 1.0
    assert hasattr(workload.model.layers[1], block_ac._BLOCK_AC_MARK)
    eager = recompute.apply_to_model(torch.nn.Linear(2, 2), TrialSpec(compile_mode="eager"))
    assert isinstance(eager, torch.nn.Linear)


# --------------------------------------------------------------------------- process environment


ENV_KEYS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_CACHE",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ENV_KEYS:
        monkeypatch.setenv(key, "sentinel")
        monkeypatch.delenv(key)


@pytest.mark.usefixtures("clean_env")
def test_environment_without_cache_root() -> None:
    spec = TrialSpec(cuda_alloc_conf="expandable_segments:True")
    recompute.prepare_process_environment(TrialRun(spec=spec, workload="builtin:tiny-gpt"))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"
    assert os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "0"
    assert os.path.isdir(os.environ["TORCHINDUCTOR_CACHE_DIR"])


@pytest.mark.usefixtures("clean_env")
def test_environment_with_cache_root(tmp_path) -> None:
    spec = TrialSpec(recompute_ops_added=("aten.mm",))
    run = TrialRun(spec=spec, workload="builtin:tiny-gpt", cache_root=str(tmp_path))
    recompute.prepare_process_environment(run)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    assert "TORCHINDUCTOR_FX_GRAPH_CACHE" not in os.environ
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == run.cache_dir()
    assert run.cache_dir().endswith(spec.partition_variant())
    # Triton's cache is keyed by kernel source and target: one for every variant of the root
    assert os.environ["TRITON_CACHE_DIR"] == os.path.join(str(tmp_path), "triton")
    greedy = TrialSpec(knapsack_solver="greedy")
    other = TrialRun(spec=greedy, workload="builtin:tiny-gpt", cache_root=str(tmp_path))
    recompute.prepare_process_environment(other)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] != run.cache_dir()
    assert os.environ["TRITON_CACHE_DIR"] == os.path.join(str(tmp_path), "triton")


def test_aggressive_recomputation_saves_less_for_backward() -> None:
    # torch 2.13, CPU tiny LM at budget 1.0: 28 tensors, 2.50 MB saved -> 20, 1.45 MB.
    _, default_bytes = saved_stats()
    _, aggressive_bytes = saved_stats(aggressive_recomputation=True)
    assert aggressive_bytes < default_bytes


def test_the_op_policy_is_torchtitans_selective_ac() -> None:
    """Issue 31: the op policy follows torchtitan's SelectiveAC at TORCHTITAN_COMMIT: it saves
    linear, mm, addmm, bmm, topk and max outputs and a CUDA-to-CPU copy, recomputes every second
    mm or linear (forward and recompute counted apart) and everything else; but for topk,
    which it recomputes (issue 45: transformers' MoE routers write into it)."""
    import types

    from torch.utils.checkpoint import CheckpointPolicy

    from budgettune.trial.block_ac import _torchtitan_op_policy, torchtitan_save_ops

    aten = torch.ops.aten
    save = torchtitan_save_ops()
    for op in (aten.linear.default, aten.mm.default, aten.addmm.default, aten.bmm.default,
               aten.topk.default, aten.max.default):  # fmt: skip
        assert op in save, op
    assert aten.gelu.default not in save and aten.add.Tensor not in save
    policy = _torchtitan_op_policy()
    forward = types.SimpleNamespace(is_recompute=False)
    recompute = types.SimpleNamespace(is_recompute=True)
    x = torch.zeros(2)
    mm = [policy(forward, aten.mm.default, x) for _ in range(4)]
    assert mm == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    # the recompute counts its own mms: its first is saved-as-forward again
    assert policy(recompute, aten.linear.default, x) == CheckpointPolicy.MUST_SAVE
    assert policy(forward, aten.bmm.default, x) == CheckpointPolicy.MUST_SAVE  # not counted
    assert policy(forward, aten.gelu.default, x) == CheckpointPolicy.PREFER_RECOMPUTE
    assert policy(forward, aten.topk.default, x, 2) == CheckpointPolicy.PREFER_RECOMPUTE
    to_host = policy(forward, aten._to_copy.default, types.SimpleNamespace(device="cuda:0"),
                     device="cpu")  # fmt: skip
    assert to_host == CheckpointPolicy.MUST_SAVE
