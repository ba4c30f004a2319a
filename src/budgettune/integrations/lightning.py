"""A budgettune pin in a Lightning `Trainer`: one callback (Lightning 2.x).

    pin = PinCallback("best.json", module="model")   # first: before anything touches CUDA
    trainer = lightning.Trainer(callbacks=[pin], ...)
    trainer.fit(LitModel(), loader)

What it applies, and at which of Lightning's hooks:

- the allocator setting, when the callback is constructed (build it before CUDA is touched);
- the model, at ``setup`` (stage ``fit``: before the strategy moves the model to its device,
  wraps or shards it, and before ``configure_optimizers``): the trial's model changes
  (``use_cache=False``), block AC, ``forward`` compiled in place with the partitioner settings
  scoped. ``module`` names the attribute of your `LightningModule` that holds the network
  your ``training_step`` calls (``self.model(...)``); without it the `LightningModule`'s own
  ``forward`` is compiled (a ``training_step`` that calls ``self(...)``). If the compiled
  forward does not run in the first training step, it warns;
- the optimizer implementation, at ``on_fit_start`` (``configure_optimizers`` has run, no step
  yet): each optimizer is initialised again in place with the pinned flag, so its schedulers
  keep pointing at it.

A model built in ``configure_model`` does not exist yet at ``setup``: build it in
``__init__``. Imports ``lightning.pytorch``, or ``pytorch_lightning`` when only that is
installed; the callback's base class is that package's, so use the matching `Trainer`.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

from budgettune.errors import SpecError
from budgettune.integrations.trainer_pin import TrainerPin
from budgettune.pinning import PinnedConfig, StalePinWarning


def _lightning() -> Any:
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


pl = _lightning()

__all__ = ["PinCallback"]


class PinCallback(pl.Callback):  # type: ignore[misc,name-defined]
    """Applies a budgettune pin to a `LightningModule` and its optimizers (see the module
    docstring).

    Args:
        pin: a pinned JSON (``budgettune export``) or a loaded `PinnedConfig`.
        module: the attribute of the `LightningModule` holding the network to pin (``"model"``);
            None: the `LightningModule` itself.

    Raises:
        PinnedConfigError: a missing, corrupt or other-schema pin.
    """

    def __init__(self, pin: str | Path | PinnedConfig, *, module: str | None = None) -> None:
        super().__init__()
        self.pin = TrainerPin.load(pin)
        self.module = module

    def _target(self, pl_module: Any) -> Any:
        if self.module is None:
            return pl_module
        target = getattr(pl_module, self.module, None)
        if target is None:
            raise SpecError(
                f"PinCallback(module={self.module!r}): {type(pl_module).__name__} has no "
                f"attribute {self.module!r} (built in configure_model? build it in __init__)"
            )
        return target

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Before fitting: apply the pin to the model; warn when the trainer accumulates
        otherwise than the pin was measured (the loader's batch size is the user's loader's:
        the pin's is `PinnedConfig.micro_batch`)."""
        if stage != "fit":
            return
        self.pin.apply_model(self._target(pl_module))
        pinned = self.pin.pinned
        accumulate = getattr(trainer, "accumulate_grad_batches", pinned.accum_steps)
        if accumulate != pinned.accum_steps:
            warnings.warn(
                f"pinned config {pinned.path} was measured with {pinned.accum_steps} "
                f"micro-batch(es) accumulated per optimizer step"
                + (f" of {pinned.micro_batch} rows" if pinned.micro_batch else "")
                + f"; this Trainer accumulates {accumulate}: set "
                f"lightning.Trainer(accumulate_grad_batches={pinned.accum_steps})",
                StalePinWarning,
                stacklevel=2,
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """The optimizers are built, none has stepped: the pinned implementation."""
        self.pin.apply_optimizers(trainer.optimizers)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the first step: warn if the compiled forward never ran."""
        self.pin.check_forward_ran(
            hint="training_step calls another module: pass PinCallback(..., module='NAME') "
            "naming the attribute it calls"
        )
