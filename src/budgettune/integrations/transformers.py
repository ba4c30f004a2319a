"""A budgettune pin in a Hugging Face `transformers` `Trainer`: one callback.

    pin = PinCallback("best.json")           # first: before the model goes to the GPU
    model = AutoModelForCausalLM.from_pretrained(...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[pin])
    trainer.train()

What it applies, and at which of the `Trainer`'s events (transformers 4.57 and 5.x):

- the allocator setting (``PYTORCH_CUDA_ALLOC_CONF``), when the callback is constructed: build
  it before anything touches CUDA (before ``from_pretrained(..., device_map=...)``,
  ``model.to("cuda")`` or ``Trainer(...)``, which moves the model to its device); built later,
  the setting reaches only memory reserved from then on, and it warns;
- the model, at ``on_init_end`` (the end of ``Trainer.__init__``, the model on its device;
  or at ``on_train_begin`` for a callback added later or a ``model_init``): the trial's model
  changes (``use_cache=False`` on every `transformers` model inside), block AC, ``forward``
  compiled in place with the partitioner settings scoped to its calls. The model stays the
  same object, so the `Trainer` still saves it, reads its config and drops the dataset
  columns its forward does not take;
- the optimizer implementation, at ``on_train_begin``: the `Trainer` has built its optimizer
  (from ``optim``, ``optimizers=`` or ``create_optimizer``) and its scheduler by then, and
  has not stepped; the optimizer is initialised again in place with the pinned flag
  (``fused=True``), so the scheduler and accelerate's wrapper keep pointing at it.

Not for a pin measured sharded (FSDP2 under torchrun: apply it with ``pinned.compile``), nor
``nn.DataParallel`` (several GPUs without torchrun), whose replicas would not share the
in-place forward. `write_workload` turns a `Trainer` into a workload to search.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import transformers

from budgettune.integrations.trainer_pin import TrainerPin
from budgettune.integrations.trainer_workload import write_workload
from budgettune.pinning import PinnedConfig, StalePinWarning

__all__ = ["PinCallback", "write_workload"]

_CHECKPOINTING_ARGS = ("activation_checkpointing", "gradient_checkpointing")


class PinCallback(transformers.TrainerCallback):  # type: ignore[misc]
    """Applies a budgettune pin to a `Trainer`'s model and optimizer (see the module docstring).

    Args:
        pin: a pinned JSON (``budgettune export``) or a loaded `PinnedConfig`.

    Raises:
        PinnedConfigError: a missing, corrupt or other-schema pin.
    """

    def __init__(self, pin: str | Path | PinnedConfig) -> None:
        self.pin = TrainerPin.load(pin)
        self._args_checked = False

    def _check_args(self, args: Any) -> None:
        """Warn about `TrainingArguments` that run something the pin did not measure."""
        if self._args_checked:
            return
        self._args_checked = True
        spec = self.pin.pinned.spec
        for name in _CHECKPOINTING_ARGS:
            if getattr(args, name, False):
                warnings.warn(
                    f"pinned config {self.pin.pinned.path}: TrainingArguments({name}=True) adds "
                    "transformers' own checkpointing to the pin's, which was measured without "
                    f"it: set {name}=False",
                    StalePinWarning,
                    stacklevel=4,
                )
        wanted = self.pin.pinned.batch_arguments()
        other = {k: getattr(args, k, v) for k, v in wanted.items() if getattr(args, k, v) != v}
        if other:  # the step the pin measured is another batch's (issue 46)
            warnings.warn(
                f"pinned config {self.pin.pinned.path} was measured at "
                + ", ".join(f"{k}={v}" for k, v in wanted.items())
                + "; these TrainingArguments run "
                + ", ".join(f"{k}={v}" for k, v in other.items())
                + ": build them with TrainingArguments(**pinned.batch_arguments(), ...)",
                StalePinWarning,
                stacklevel=4,
            )
        if spec.is_compiled and getattr(args, "torch_compile", False):
            warnings.warn(
                f"pinned config {self.pin.pinned.path}: the pin compiles the model itself; "
                "TrainingArguments(torch_compile=True) would compile it again: set it False",
                StalePinWarning,
                stacklevel=4,
            )

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The end of ``Trainer.__init__``: apply the pin to the model."""
        self._check_args(args)
        model = kwargs.get("model")
        if model is not None:
            self.pin.apply_model(model)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Before the first step: the model (if ``on_init_end`` did not see it) and the
        optimizer the `Trainer` built."""
        self._check_args(args)
        model = kwargs.get("model")
        if model is not None:
            self.pin.apply_model(model)
        optimizer = kwargs.get("optimizer")
        if optimizer is not None:
            self.pin.apply_optimizers([optimizer])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the first step: warn if the compiled forward never ran."""
        self.pin.check_forward_ran(
            hint="a compute_loss of your own must call the model the Trainer was given"
        )
