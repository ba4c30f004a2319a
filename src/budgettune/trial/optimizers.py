"""The optimizer a trial steps: the workload's own, rebuilt with the spec's implementation flag.

Shared by the trial child (`recompute.prepare`) and a training job (`PinnedConfig.optimizer`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    import torch

    from budgettune.workload import Workload


def build_optimizer(workload: Workload, spec: TrialSpec, params: Any) -> torch.optim.Optimizer:
    """Build the workload's optimizer, rebuilt with the spec's implementation flag.

    Args:
        workload: gives the optimizer factory (AdamW(lr=1e-4) when it has none).
        spec: its ``optimizer_impl`` goes to `rebuild_optimizer`.
        params: what the factory gets, e.g. ``model.parameters()``.

    Raises:
        SpecError: when the optimizer class has no such flag.
    """
    import torch

    optimizer: torch.optim.Optimizer
    if workload.optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=1e-4)
    else:
        optimizer = workload.optimizer(params)
    return rebuild_optimizer(optimizer, spec.optimizer_impl)


def _flagged(
    optimizer: torch.optim.Optimizer, impl: str
) -> tuple[dict[str, bool], list[dict[str, Any]], dict[str, Any]] | None:
    """The flags, param groups and ``__init__`` defaults of ``optimizer`` rebuilt with ``impl``
    (None: ``as_written``, nothing to change)."""
    if impl == "as_written":
        return None
    if impl not in ("foreach", "fused"):
        raise SpecError(
            f"unknown optimizer_impl {impl!r}; choose one of: as_written, foreach, fused"
        )
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if impl not in accepted:
        raise SpecError(
            f"optimizer_impl {impl!r}: {cls.__module__}.{cls.__qualname__} takes no {impl!r} "
            "flag; use optimizer_impl 'as_written'"
        )
    other = "fused" if impl == "foreach" else "foreach"
    flags = {impl: True, **({other: False} if other in accepted else {})}
    # defaults can hold keys __init__ does not take (AdamW: decoupled_weight_decay).
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    defaults.update(flags)
    groups = [{**group, **flags} for group in optimizer.param_groups]
    return flags, groups, defaults


def rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer with an implementation flag: same class, param groups and defaults.

    Call before the first step (optimizer state is not carried over).

    Args:
        optimizer: a `torch.optim` optimizer (or any class taking the flag in ``__init__``).
        impl: ``as_written`` (returns ``optimizer`` itself), ``foreach`` or ``fused`` (that flag
            True, the other one False where the class has it).

    Raises:
        SpecError: on an unknown impl, or a class whose ``__init__`` has no such flag.
    """
    flagged = _flagged(optimizer, impl)
    if flagged is None:
        return optimizer
    _, groups, defaults = flagged
    return type(optimizer)(groups, **defaults)


def rebuild_optimizer_in_place(optimizer: torch.optim.Optimizer, impl: str) -> None:
    """`rebuild_optimizer`, on the same object: for an optimizer a trainer already holds.

    The optimizer is initialised again with the flag (its class's ``__init__``, as a new one
    would be), so every reference to it stays valid: the trainer's, a learning-rate
    scheduler's, accelerate's or Lightning's wrapper. State it holds already (a checkpoint a
    trainer resumed from) is kept: it is loaded back with the flag set, which puts it where
    the flagged implementation expects it (fused AdamW keeps ``step`` on the device).

    Args:
        optimizer: a `torch.optim` optimizer.
        impl: as in `rebuild_optimizer`.

    Raises:
        SpecError: on an unknown impl, or a class whose ``__init__`` has no such flag.
    """
    flagged = _flagged(optimizer, impl)
    if flagged is None:
        return
    flags, groups, defaults = flagged
    saved = optimizer.state_dict() if optimizer.state else None
    type(optimizer).__init__(optimizer, groups, **defaults)  # type: ignore[misc]
    if saved is not None:
        saved["param_groups"] = [{**group, **flags} for group in saved["param_groups"]]
        optimizer.load_state_dict(saved)
