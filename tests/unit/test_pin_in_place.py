"""A pin applied to objects a trainer holds (issue 32): the optimizer initialised again in
place, keeping its state and its scheduler; the forward compiled in place, once."""

from __future__ import annotations

import inspect

import pytest
import torch

from budgettune.errors import SpecError
from budgettune.trial.optimizers import rebuild_optimizer_in_place
from budgettune.trial.scoped_forward import compile_forward_in_place, scoped_forward_of
from budgettune.trial.spec import TrialSpec


def test_an_optimizer_rebuilt_in_place_keeps_its_state_and_its_scheduler() -> None:
    """As after a Trainer resumed from a checkpoint: state loaded, scheduler built on it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    moment = optimizer.state[model.weight]["exp_avg"].clone()
    rebuild_optimizer_in_place(optimizer, "foreach")
    assert optimizer.defaults["foreach"] is True and optimizer.defaults["fused"] is False
    assert all(group["foreach"] is True for group in optimizer.param_groups)
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], moment)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)  # the scheduler's, kept
    optimizer.step()
    scheduler.step()
    assert scheduler.optimizer is optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-3)
    with pytest.raises(SpecError, match="takes no 'fused'"):
        rebuild_optimizer_in_place(torch.optim.LBFGS(model.parameters()), "fused")


def test_a_forward_is_compiled_in_place_once_and_an_eager_pin_leaves_it() -> None:
    model = torch.nn.Linear(2, 2)
    assert compile_forward_in_place(model, TrialSpec(compile_mode="eager")) is None
    assert scoped_forward_of(model) is None
    spec = TrialSpec(compile_backend="aot_eager_decomp_partition")
    state = compile_forward_in_place(model, spec)
    assert state is not None and scoped_forward_of(model) is state and state.calls == 0
    assert list(inspect.signature(model.forward).parameters) == ["input"]
    with pytest.raises(SpecError, match="compiled in place already"):
        compile_forward_in_place(model, spec)
