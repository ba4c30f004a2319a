"""A budget below 1.0 never re-draws a random op in backward (pytorch#190758): dropout's
backward applies the forward's mask, so the gradients are those of budget 1.0."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from budgettune.trial.partitioner import functorch_settings, partitioner_settings
from budgettune.trial.spec import TrialSpec


def _grads(budget: float) -> list[torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Dropout(0.3), nn.Linear(128, 32))
    x = torch.randn(64, 32)
    spec = TrialSpec(compile_backend="aot_eager_decomp_partition", activation_memory_budget=budget)
    compiled = torch.compile(model, backend=spec.compile_backend)
    torch.manual_seed(1)
    with partitioner_settings(spec):
        compiled(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("budget", [0.3, 0.05])
def test_a_budget_below_one_keeps_the_forwards_dropout_mask(budget: float) -> None:
    reference = _grads(1.0)
    got = _grads(budget)
    # without the pass the knapsack recomputes aten.rand in backward: another mask
    for want, have in zip(reference, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)


def test_the_pass_is_set_only_where_the_knapsack_runs() -> None:
    import torch._functorch.config as functorch_config

    def has_pass(budget: float) -> bool:
        spec = TrialSpec(activation_memory_budget=budget)
        return "joint_custom_pass" in functorch_settings(spec, functorch_config)

    assert has_pass(0.5) and has_pass(0.01)
    # 1.0 runs no knapsack; 0.0 saves only the inputs, before any mark is read
    assert not has_pass(1.0) and not has_pass(0.0)
