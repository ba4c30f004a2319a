"""A pin applied to what a trainer holds: its model and its optimizer, both in place.

A trainer (transformers' `Trainer`, Lightning's) builds and keeps the model and the optimizer,
and hands them to its callbacks; a callback cannot swap them for new objects. So the pin is
applied to the objects themselves, and everything the README's three lines do still happens:

- the allocator setting, when the pin is loaded (`TrainerPin.load`): a callback built before
  anything touches CUDA gives it to the whole run, as `budgettune.load_pinned` does;
- the model: `PinnedConfig.compile(model, in_place=True)` (the trial's model changes such as
  ``use_cache=False``, block AC, ``forward`` compiled with the partitioner settings scoped);
- the optimizer: `PinnedConfig.optimizer(optimizer, in_place=True)` once the trainer has built
  it, before its first step (the trainer's scheduler keeps pointing at it).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgettune.pinning import PinnedConfig, StalePinWarning, load_pinned
from budgettune.trial.allocator import AllocatorApplied
from budgettune.trial.hf_cache import apply_model_changes
from budgettune.trial.scoped_forward import ScopedForward, scoped_forward_of

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The `torch.optim` optimizer inside a trainer's wrapper (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``), or the optimizer itself."""
    import torch

    inner = optimizer
    for attribute in ("optimizer", "_optimizer"):
        while isinstance(getattr(inner, attribute, None), torch.optim.Optimizer):
            inner = getattr(inner, attribute)
    return inner  # type: ignore[no-any-return]


@dataclass(kw_only=True)
class TrainerPin:
    """One pin, applied once to each model and optimizer a trainer hands over."""

    pinned: PinnedConfig
    """The pin."""
    allocator: AllocatorApplied
    """How this process took the pin's allocator setting, when the pin was loaded."""
    applied: list[Any] = field(default_factory=list)
    """The models and optimizers the pin was applied to (held: an id alone can be reused)."""
    forwards: list[tuple[str, ScopedForward]] = field(default_factory=list)
    """Each model whose forward was compiled in place, by class name."""
    checked: bool = False
    """Whether `check_forward_ran` has looked already."""

    @classmethod
    def load(cls, pin: str | Path | PinnedConfig) -> TrainerPin:
        """Read the pin (warning when stale, as `load_pinned`) and give this process its
        allocator setting now.

        Raises:
            PinnedConfigError: a missing, corrupt or other-schema file.
        """
        if isinstance(pin, PinnedConfig):
            pinned = pin
        else:
            pinned = load_pinned(pin, apply_allocator=False)
        return cls(pinned=pinned, allocator=pinned.apply_allocator(stacklevel=4))

    def _first_time(self, thing: Any) -> bool:
        if any(seen is thing for seen in self.applied):
            return False
        self.applied.append(thing)
        return True

    def apply_model(self, model: nn.Module) -> None:
        """`PinnedConfig.compile(model, in_place=True)`, once per model.

        Raises:
            SpecError: block AC asked for and no repeated blocks found, or a spec this
                process cannot run.
            PinnedConfigError: a pin measured sharded.
        """
        if not self._first_time(model):
            # again at train begin: transformers' Trainer sets config.use_cache from its
            # arguments after its callbacks' on_init_end, undoing the trial's model changes
            apply_model_changes(model, self.pinned.model_changes)
            return
        self.pinned.compile(model, in_place=True)
        state = scoped_forward_of(model)
        if state is not None:
            self.forwards.append((type(model).__name__, state))

    def apply_optimizers(self, optimizers: Iterable[Any]) -> None:
        """`PinnedConfig.optimizer(optimizer, in_place=True)`, once per optimizer.

        Raises:
            SpecError: the optimizer's class takes no such implementation flag.
        """
        for wrapped in optimizers:
            optimizer = torch_optimizer(wrapped)
            if self._first_time(optimizer):
                self.pinned.optimizer(optimizer, in_place=True)

    def check_forward_ran(self, *, hint: str) -> None:
        """After the first training step: warn (`StalePinWarning`) when a forward compiled in
        place never ran, so the step ran without the pin's compile and partitioner settings.

        Args:
            hint: what to do instead, for the warning.
        """
        if self.checked:
            return
        self.checked = True
        idle = [name for name, state in self.forwards if state.calls == 0]
        if idle:
            warnings.warn(
                f"pinned config {self.pinned.path}: the compiled forward of {', '.join(idle)} "
                f"did not run in the first training step, so the pin's compile and partitioner "
                f"settings did not either: {hint}",
                StalePinWarning,
                stacklevel=3,
            )
