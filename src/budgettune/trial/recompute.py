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
import dataclasses
import functools
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.blocks import find_blocks
from budgettune.errors import SpecError
from budgettune.trial.block_ac import apply_block_ac
from budgettune.trial.environment import prepare_process_environment  # noqa: F401 - re-exported
from budgettune.trial.hf_cache import apply_model_changes, turn_off_kv_cache
from budgettune.trial.optimizers import build_optimizer, rebuild_optimizer  # noqa: F401 - re-exported
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from budgettune.workload import Workload

_CONFIG_KEYS = (
    "activation_memory_budget",
    "activation_memory_budget_solver",
    "activation_memory_budget_runtime_estimator",
)


# --------------------------------------------------------------------------- partitioner knobs


def resolve_ops(names: Sequence[str]) -> list[Any]:
    """Resolve op names to torch op packets: ``aten.add`` → ``torch.ops.aten.add``.

    Args:
        names: ``namespace.op`` names (namespace ``aten`` or ``prims``), no overload suffix.

    Returns:
        The `OpOverloadPacket` of each name, in order (the partitioner's op lists hold packets).

    Raises:
        SpecError: when a name is malformed or no such op exists in this torch.
    """
    import torch

    ops = []
    for name in names:
        namespace, _, op_name = name.partition(".")
        if namespace not in ("aten", "prims") or not op_name or "." in op_name:
            raise SpecError(
                f"unknown op {name!r}; write an aten or prims op without overload, "
                "e.g. aten.add or prims.convert_element_type"
            )
        try:
            op = getattr(getattr(torch.ops, namespace), op_name)
        except (AttributeError, RuntimeError):
            op = None
        if not isinstance(op, torch._ops.OpOverloadPacket):
            raise SpecError(
                f"unknown op {name!r} in torch {torch.__version__}; write an existing "
                "aten/prims op without overload, e.g. aten.add or aten.mm"
            )
        ops.append(op)
    return ops


def check_spec_supported(spec: TrialSpec, device_type: str) -> None:
    """Fail early, before anything compiles, on a spec this process cannot run.

    Args:
        spec: the configuration.
        device_type: ``cpu`` or ``cuda``.

    Raises:
        SpecError: profile estimator off CUDA, ilp solver without scipy, unknown ops, or a
            partitioner that lacks a knob the spec sets.
    """
    import torch._functorch.config as functorch_config
    import torch._functorch.partitioners as partitioners

    if spec.is_compiled and spec.runtime_estimator == "profile" and device_type != "cuda":
        raise SpecError(
            f"runtime_estimator 'profile' benchmarks ops on a GPU and needs CUDA, not "
            f"{device_type!r}; use runtime_estimator 'flops'"
        )
    if spec.is_compiled and spec.knapsack_solver == "ilp":
        if importlib.util.find_spec("scipy") is None:
            raise SpecError("knapsack_solver 'ilp' needs scipy: run `pip install scipy`")
    for key in _CONFIG_KEYS:
        if not hasattr(functorch_config, key):
            raise SpecError(f"this torch's functorch config has no {key}; upgrade torch (>= 2.6)")
    if spec.recompute_ops_removed or spec.recompute_ops_added:
        if not callable(getattr(partitioners, "get_default_op_list", None)):
            raise SpecError(
                "this torch's partitioner has no get_default_op_list, so the recomputable "
                "op list cannot be changed; upgrade torch or leave the op lists empty"
            )
    resolve_ops(spec.recompute_ops_removed)
    resolve_ops(spec.recompute_ops_added)


def _op_list_override(
    original: Callable[[], Any], removed: Sequence[Any], added: Sequence[Any]
) -> Callable[[], Any]:
    """A `get_default_op_list` that edits the recomputable list of the original's result.

    The partitioner derives ``fusible_ops = recomputable_ops | random_ops`` and uses fusibility
    to decide whether saving a node materialises it; we keep that invariant, so an added op
    (e.g. aten.mm) is not banned as "materialized in backward" before the allowlist is even
    consulted. The original returns a fresh `OpTypes` per call; we still build a new one.
    """

    @functools.wraps(original)
    def get_default_op_list() -> Any:
        op_types = original()
        for attr in ("recomputable_ops", "fusible_ops", "random_ops"):
            if not hasattr(op_types, attr):
                raise RuntimeError(
                    f"torch's partitioner OpTypes has no {attr}; this torch is not supported "
                    "for recompute op-list overrides"
                )
        ordered_set = type(op_types.recomputable_ops)
        recomputable = ordered_set(
            [op for op in op_types.recomputable_ops if op not in removed]
            + [op for op in added if op not in op_types.recomputable_ops]
        )
        fusible = ordered_set(
            [op for op in op_types.fusible_ops if op not in removed or op in op_types.random_ops]
            + [op for op in added if op not in op_types.fusible_ops]
        )
        return dataclasses.replace(op_types, recomputable_ops=recomputable, fusible_ops=fusible)

    return get_default_op_list


@contextlib.contextmanager
def partitioner_settings(spec: TrialSpec) -> Iterator[None]:
    """Scope the spec's partitioner knobs: budget, solver, estimator and the recomputable ops.

    Everything is restored on exit, including after an exception. Nested use is allowed (the
    inner spec wins inside).

    Raises:
        SpecError: on an unknown op name.
    """
    import torch._functorch.config as functorch_config
    import torch._functorch.partitioners as partitioners

    removed = resolve_ops(spec.recompute_ops_removed)
    added = resolve_ops(spec.recompute_ops_added)
    patch = functorch_config.patch(
        activation_memory_budget=spec.activation_memory_budget,
        activation_memory_budget_solver=spec.knapsack_solver,
        activation_memory_budget_runtime_estimator=spec.runtime_estimator,
    )
    with patch:
        if not removed and not added:
            yield
            return
        original = partitioners.get_default_op_list
        partitioners.get_default_op_list = _op_list_override(original, removed, added)
        try:
            yield
        finally:
            partitioners.get_default_op_list = original


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

    def run_step(self) -> torch.Tensor:
        """One full training step; returns the (detached) loss."""
        loss = self.forward_loss()
        self.backward(loss)
        self.optimizer_step()
        return loss.detach()


def prepare(workload: Workload, spec: TrialSpec, device: torch.device) -> PreparedStep:
    """Apply a spec to a workload: checks, block AC, optimizer, compile (lazy).

    Raises:
        SpecError: when the spec cannot run here (see `check_spec_supported`), or block AC is
            asked for and the model has no repeated blocks.
    """
    check_spec_supported(spec, device.type)
    model = workload.model
    model_changes: tuple[str, ...] = ()
    if spec.block_ac_every:
        blocks = list(workload.blocks) if workload.blocks is not None else find_blocks(model)
        if not blocks:
            raise SpecError(
                "block_ac_every needs repeated blocks: pass Workload(blocks=model.layers)"
            )
        model_changes = turn_off_kv_cache(model)
        apply_block_ac(blocks, spec.block_ac_every, spec.block_ac_policy)
    optimizer = build_optimizer(workload, spec, model.parameters())
    compiled = compile_model(model, spec)
    return PreparedStep(
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
    prepare_model(model, spec, blocks, model_changes=model_changes)
    if not spec.is_compiled:
        return model
    return scoped_module_class()(model, compile_model(model, spec), spec)


def prepare_model(
    model: nn.Module,
    spec: TrialSpec,
    blocks: Sequence[nn.Module] | None = None,
    *,
    model_changes: Sequence[str] = (),
) -> None:
    """`apply_to_model` up to the compile: checks, the trial's model changes and block AC, in
    place (see its arguments).

    Raises:
        SpecError: on an unsupported spec or block AC without blocks.
    """
    device_type = next((p.device.type for p in model.parameters()), "cpu")
    check_spec_supported(spec, device_type)
    apply_model_changes(model, model_changes)
    if spec.block_ac_every:
        found = list(blocks) if blocks is not None else find_blocks(model)
        if not found:
            raise SpecError("block_ac_every needs repeated blocks: pass blocks=model.layers")
        # What was measured is what runs: the trial turned a transformers model's cache off
        # (a pin written before model changes were recorded is covered by the same rule).
        turn_off_kv_cache(model)
        apply_block_ac(found, spec.block_ac_every, spec.block_ac_policy)
