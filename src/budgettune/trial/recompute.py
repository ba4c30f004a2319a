"""Applies a `TrialSpec` to torch: functorch config, op list, block AC, optimizer, compile.

Shared by the trial child (`trial/child.py`, through `prepare`) and by `pinning.py` in a user's
training job (through `apply_to_model`). The functorch settings are always *scoped*
(`partitioner_settings`), never set globally: AOTAutograd partitions lazily, during the first
call of a compiled function, so every call that may compile runs inside the scope.

`environment.prepare_process_environment` runs in the child before torch is imported; everything
here imports torch lazily or at call time so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import importlib.util  # noqa: F401 - `check_spec_supported` looks scipy up through it
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.blocks import find_blocks
from budgettune.errors import SpecError
from budgettune.trial.block_ac import apply_block_ac, is_checkpointed
from budgettune.trial.block_compile import compile_forwards
from budgettune.trial.environment import prepare_process_environment  # noqa: F401 - re-exported
from budgettune.trial.hf_cache import apply_model_changes, turn_off_kv_cache
from budgettune.trial.offload import ActivationOffload, apply_block_offload
from budgettune.trial.optimizers import build_optimizer, rebuild_optimizer  # noqa: F401 - re-exported
from budgettune.trial.partitioner import (  # noqa: F401 - re-exported
    PARTITIONER_KNOBS,
    check_spec_supported,
    functorch_settings,
    partitioner_settings,
    resolve_ops,
)
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from budgettune.workload import Workload

_CONFIG_KEYS = tuple(str(k.functorch_key) for k in PARTITIONER_KNOBS)
"""The ``torch._functorch.config`` settings the partitioner knobs scope."""


# --------------------------------------------------------------------------- compile


def compile_model(model: nn.Module | Callable[..., Any], spec: TrialSpec) -> Callable[..., Any]:
    """`torch.compile` the model (or a function) as the spec says (``eager``: unchanged).

    Compilation is lazy: call the result inside `partitioner_settings(spec)`.
    """
    import torch

    if not spec.is_compiled:
        return model
    if spec.compile_backend == "inductor":
        mode = None if spec.compile_mode == "default" else spec.compile_mode
        return torch.compile(model, backend="inductor", mode=mode)
    return torch.compile(model, backend=spec.compile_backend)


# --------------------------------------------------------------------------- the prepared step


@dataclass(kw_only=True)
class PreparedStep:
    """One workload with a spec applied: what `measure.py` runs step after step."""

    model: nn.Module
    """The original model (blocks possibly wrapped for AC); owns the parameters."""
    compiled: Callable[..., Any]
    """What the loss calls: the compiled model, or the model itself when eager."""
    optimizer: torch.optim.Optimizer
    """The optimizer over the model's parameters."""
    loss_fn: Callable[[Any, Any], torch.Tensor]
    """``loss(model, batch) -> scalar``."""
    batch: Any
    """The batch pytree, on the device."""
    autocast_dtype: torch.dtype | None
    """Forward and loss run under `torch.autocast` with this dtype when set."""
    device: torch.device
    """Where the step runs."""
    spec: TrialSpec
    """The applied configuration."""
    model_changes: tuple[str, ...] = ()
    """What applying the spec changed in the model besides the knobs (``use_cache=False``)."""
    offload: ActivationOffload | None = None
    """The offload hooks around every k-th block (their ledger counts the host bytes)."""

    def forward_loss(self) -> torch.Tensor:
        """Forward and loss, inside the spec's partitioner settings (compilation happens here)."""
        import torch

        with contextlib.ExitStack() as stack:
            stack.enter_context(partitioner_settings(self.spec))
            if self.autocast_dtype is not None:
                stack.enter_context(
                    torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
                )
            return self.loss_fn(self.compiled, self.batch)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward (inside the settings too: a lazily compiled backward sees the same config)."""
        with partitioner_settings(self.spec):
            loss.backward()

    def optimizer_step(self) -> None:
        """`optimizer.step()` then `zero_grad(set_to_none=True)`."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self) -> torch.Tensor:
        """One forward+backward pass (the gradients add up to those already there); returns
        the (detached) loss."""
        loss = self.forward_loss()
        self.backward(loss)
        return loss.detach()

    def run_step(self) -> torch.Tensor:
        """One full training step: ``spec.accum_steps`` forward+backward passes, then the
        optimizer; returns the last (detached) loss."""
        for _ in range(self.spec.accum_steps):
            loss = self.forward_backward()
        self.optimizer_step()
        return loss


def prepare(workload: Workload, spec: TrialSpec, device: torch.device) -> PreparedStep:
    """Apply a spec to a workload: checks, block AC, optimizer, compile (lazy).

    Raises:
        SpecError: when the spec cannot run here (see `check_spec_supported`), or block AC is
            asked for and the model has no repeated blocks.
    """
    check_spec_supported(spec, device.type)
    model = workload.model
    model_changes, offload = apply_to_blocks(
        model, spec, workload.blocks, device.type, how="Workload(blocks=model.layers)"
    )
    optimizer = build_optimizer(workload, spec, model.parameters())
    compiled = model if spec.compiles_blocks else compile_model(model, spec)
    return PreparedStep(
        offload=offload,
        model=model,
        compiled=compiled,
        optimizer=optimizer,
        loss_fn=workload.loss,
        batch=workload.batch,
        autocast_dtype=workload.autocast_dtype,
        device=device,
        spec=spec,
        model_changes=model_changes,
    )


def scoped_module_class() -> type:
    from torch import nn

    class RecomputeScoped(nn.Module):
        """Calls the compiled module inside the spec's partitioner settings.

        The original module is registered as ``module`` (state_dict keys get a ``module.``
        prefix; save ``wrapper.module.state_dict()`` for the original keys).
        """

        def __init__(self, module: nn.Module, compiled: Callable[..., Any], spec: TrialSpec):
            super().__init__()
            self.module = module
            self._compiled = [compiled]  # a list: keep the OptimizedModule out of the tree
            self.spec = spec

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            with partitioner_settings(self.spec):
                return self._compiled[0](*args, **kwargs)

    return RecomputeScoped


def apply_to_model(
    model: nn.Module,
    spec: TrialSpec,
    blocks: Sequence[nn.Module] | None = None,
    *,
    model_changes: Sequence[str] = (),
) -> nn.Module:
    """Apply a pinned spec in a user's training job: the trial's model changes, block AC, then
    compile, scoped settings.

    Args:
        model: the model, on its device.
        spec: the pinned configuration (its optimizer and allocator knobs are the caller's).
        blocks: the repeated blocks for block AC; found with `find_blocks` when None.
        model_changes: what the trial changed in the model (the pin's ``model_changes``).

    Returns:
        The model itself when ``compile_mode`` is ``eager``; else a module whose calls run the
        compiled model inside `partitioner_settings(spec)` (the backward's partition is chosen
        during the forward call, so the backward needs no scope).

    Raises:
        SpecError: on an unsupported spec or block AC without blocks.
    """
    offload = prepare_model(model, spec, blocks, model_changes=model_changes)
    if not spec.is_compiled:
        return model
    del offload  # its hooks sit on the blocks
    call = model if spec.compiles_blocks else compile_model(model, spec)
    return scoped_module_class()(model, call, spec)


def prepare_model(
    model: nn.Module,
    spec: TrialSpec,
    blocks: Sequence[nn.Module] | None = None,
    *,
    model_changes: Sequence[str] = (),
) -> ActivationOffload | None:
    """`apply_to_model` up to the compile: checks, the trial's model changes, block AC and
    offload, in place (see its arguments).

    Returns:
        The offload hooks when the spec offloads. When ``spec.compiles_blocks`` the blocks
        are compiled already (and the model must not be compiled as a whole).

    Raises:
        SpecError: on an unsupported spec or block AC without blocks.
    """
    device_type = next((p.device.type for p in model.parameters()), "cpu")
    check_spec_supported(spec, device_type)
    apply_model_changes(model, model_changes)
    # What was measured is what runs: the trial turned a transformers model's cache off
    # (a pin written before model changes were recorded is covered by the same rule).
    _, offload = apply_to_blocks(model, spec, blocks, device_type, how="blocks=model.layers")
    return offload


def apply_to_blocks(
    model: nn.Module,
    spec: TrialSpec,
    blocks: Sequence[nn.Module] | None,
    device_type: str,
    *,
    how: str,
) -> tuple[tuple[str, ...], ActivationOffload | None]:
    """Block AC, then offload or the blocks' own compile (``compile_scope`` blocks), on the
    repeated blocks (``blocks``, else those found), with the KV cache of any transformers
    model inside turned off; nothing when the three knobs are off. Shared by the trial
    (`prepare`) and the job (`prepare_model`).

    Returns:
        The model changes made (``use_cache=False``) and the offload hooks (None: no offload).

    Raises:
        SpecError: no repeated blocks (the message says ``how`` to name them).
    """
    if not (spec.block_ac_every or spec.offload_every or spec.compiles_blocks):
        return (), None
    found = repeated_blocks(spec, model, blocks, how)
    changes = turn_off_kv_cache(model)
    apply_block_ac(found, spec.block_ac_every, spec.block_ac_policy)
    for knob in ("block_ac_every", "offload_every"):
        every = getattr(spec, knob)
        if every > len(found):  # every k-th block from the k-th: none of them
            warnings.warn(
                f"{knob}={every} reaches no block: the model has {len(found)} repeated "
                f"blocks, so this runs as {knob}=0",
                stacklevel=2,
            )
    if spec.compiles_blocks and not spec.offload_every:
        compile_forwards(found, spec)  # regional compilation; offload compiles its own way
    return changes, apply_offload(model, found, spec, device_type)


def repeated_blocks(
    spec: TrialSpec, model: nn.Module, blocks: Sequence[nn.Module] | None, how: str
) -> list[nn.Module]:
    """The blocks given, else those `find_blocks` finds (maybe none).

    Raises:
        SpecError: none, and block AC or offload needs them (the message says ``how`` to
            name them).
    """
    found = list(blocks) if blocks is not None else find_blocks(model)
    if not found and (spec.block_ac_every or spec.offload_every or spec.compiles_blocks):
        knob = (
            "block_ac_every"
            if spec.block_ac_every
            else "offload_every"
            if spec.offload_every
            else "compile_scope blocks"
        )
        raise SpecError(f"{knob} needs repeated blocks: pass {how}")
    return found


def apply_offload(
    model: nn.Module, blocks: Sequence[nn.Module], spec: TrialSpec, device_type: str
) -> ActivationOffload | None:
    """Offload every ``offload_every``-th block's saved activations (after block AC). Compiled,
    each block's forward is compiled on its own (`compile_forwards`) and the hooks sit around
    the compiled call, where a whole-model compile would trace them; the rest of the model runs
    eager. None when the knob is off.

    Eager, a block under block AC is left alone: checkpoint's own saved-tensor hooks hold its
    activations, out of reach of any outer hooks (compiled, the block's compiled function saves
    through the outer hooks, and what the AC policy keeps is offloaded).

    On CPU the "host" is the same memory: the path runs (tests) but saves nothing.
    """
    if not spec.offload_every:
        return None
    compile_forwards(blocks, spec)
    return wrap_offload(blocks, spec, device_type, keep=[*model.parameters(), *model.buffers()])


def wrap_offload(
    blocks: Sequence[nn.Module], spec: TrialSpec, device_type: str, *, keep: Iterable[Any]
) -> ActivationOffload:
    """The offload hooks around every ``offload_every``-th of ``blocks`` (compiled already
    when the spec compiles; eager, blocks under block AC are skipped), never moving ``keep``
    (the model's own tensors). Shared by `apply_offload` and the sharded path."""
    offload = ActivationOffload(device_types=(device_type,))
    offload.keep(keep)
    skip = (lambda block: False) if spec.is_compiled else is_checkpointed
    apply_block_offload(blocks, spec.offload_every, offload, skip=skip)
    return offload
