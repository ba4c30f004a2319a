"""Read a pinned JSON and apply it in a training job: the job's side of a pin.

    pinned = budgettune.load_pinned("best.json")   # first: the allocator setting, before CUDA
    model = pinned.compile(model)                  # model changes, block AC, compile, scoped
    optimizer = pinned.optimizer(optimizer)        # the pinned optimizer implementation

What the trial changed is what the job gets: `load_pinned` gives the process the pin's
allocator setting (``PYTORCH_CUDA_ALLOC_CONF``; see `trial.allocator` for when it still can),
`compile` makes the trial's model changes (``use_cache=False`` on every transformers model
inside the module) and applies the knobs, `optimizer` rebuilds the optimizer with the pinned
flag. `measure_step` measures one step of the job beside the pin's figures. Torch is imported
only when a pin is applied, never to read one.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgettune.errors import PinnedConfigError, SpecError, one_line
from budgettune.pinning.choose import StalePinWarning
from budgettune.pinning.document import SCHEMA_VERSION, PinDocument, PinFingerprint
from budgettune.pinning.pin_schema import PinFields, check_figures
from budgettune.schema import first_problem
from budgettune.trial.allocator import AllocatorApplied, apply_allocator_settings, env_assignment
from budgettune.trial.distributed import (
    apply_sharded,
    sharded_mesh,
    world_rank_from_env,
    world_size_from_env,
)
from budgettune.trial.hf_cache import check_model_changes
from budgettune.trial.ranks import world_size_warning
from budgettune.trial.spec import TrialSpec
from budgettune.trial.step_meter import StepMeter

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True, kw_only=True, slots=True)
class PinnedConfig:
    """A pinned configuration, ready to apply to a model in a training job."""

    pin: PinDocument
    """The pin, typed."""
    document: Mapping[str, Any] = field(repr=False)
    """The whole pinned JSON as read (`budgettune export` writes it again unchanged)."""
    path: str = ""
    """Where it was read from."""

    @property
    def spec(self) -> TrialSpec:
        """The pinned knobs."""
        return self.pin.spec

    @property
    def model_changes(self) -> tuple[str, ...]:
        """What the trials changed in the model besides the knobs (``use_cache=False``)."""
        return self.pin.model_changes

    @property
    def micro_batch(self) -> int | None:
        """Rows of one forward+backward the pin was measured at (None: the workload's own)."""
        return self.spec.micro_batch or None

    @property
    def accum_steps(self) -> int:
        """Forward+backward passes per optimizer step (gradient accumulation; 1: none)."""
        return self.spec.accum_steps

    @property
    def global_batch(self) -> int | None:
        """Rows per optimizer step, micro-batch x accumulation (None: micro-batch not set)."""
        return self.spec.samples_per_step or None

    def batch_arguments(self) -> dict[str, int]:
        """What the job's loader and loop must run, as `transformers.TrainingArguments` names
        it: ``per_device_train_batch_size`` (when the pin set a micro-batch) and
        ``gradient_accumulation_steps``; ``TrainingArguments(**pinned.batch_arguments(),
        ...)``. Lightning: ``accumulate_grad_batches``, and the loader's ``batch_size``."""
        arguments = {"gradient_accumulation_steps": self.accum_steps}
        if self.micro_batch is not None:
            arguments = {"per_device_train_batch_size": self.micro_batch, **arguments}
        return arguments

    def env_assignment(self) -> str:
        """``PYTORCH_CUDA_ALLOC_CONF=...`` for a launch script (empty: the pin sets none)."""
        return env_assignment(self.spec.cuda_alloc_conf)

    def apply_allocator(self, *, stacklevel: int = 2) -> AllocatorApplied:
        """Give this process the pin's allocator setting (`load_pinned` and `compile` call it).

        Warns (`StalePinWarning`) when the process can no longer run as measured: CUDA held
        memory already (the setting reaches only memory reserved later), or torch cannot take it.
        """
        applied = apply_allocator_settings(self.spec.cuda_alloc_conf)
        if applied.replaced:
            warnings.warn(
                f"pinned config {self.path}: the job's {', '.join(applied.replaced)} replaced by "
                f"the pinned {applied.setting} (what was measured is what runs)",
                StalePinWarning,
                stacklevel=stacklevel + 1,
            )
        if applied.caveat:
            peak = self.pin.measured.peak_worst_bytes
            measured = (
                f"; the pin's {peak / 1e9:.2f} GB peak was measured with it " if peak else "; "
            )
            warnings.warn(
                f"pinned config {self.path}: {applied.caveat}{measured}from the start: call "
                f"budgettune.load_pinned before anything touches CUDA, or start the job with "
                f"{self.env_assignment()}",
                StalePinWarning,
                stacklevel=stacklevel + 1,
            )
        return applied

    def measure_step(
        self,
        *,
        device: torch.device | str | None = None,
        model: Any = None,
        optimizer: Any = None,
        batch: Any = None,
    ) -> StepMeter:
        """A context manager that measures one step of the job against the pin's figures.

        Wrap the job's third step (the trial measured its third, after two warm-up steps):
        ``with pinned.measure_step() as meter: ...``, then ``meter.result.summary()``. On CPU,
        pass ``model``, ``optimizer`` and ``batch`` so the bytes live before the step count.
        Under torchrun the pin's figures are this rank's (``RANK``).
        """
        measured = self.pin.measured
        peak, step_ms = measured.peak_worst_bytes, measured.step_time_ms
        rank = world_rank_from_env()
        for row in measured.per_rank or ():
            if row.rank == rank:
                peak, step_ms = row.peak_worst_bytes or peak, row.step_time_ms
        return StepMeter(
            device=device,
            mem_metric=self.pin.mem_metric,
            pinned_peak_bytes=int(peak) if peak else None,
            pinned_step_time_ms=float(step_ms) if step_ms else None,
            model=model,
            optimizer=optimizer,
            batch=batch,
        )

    @property
    def fingerprint(self) -> PinFingerprint:
        """torch/CUDA versions, device name and workload fingerprint of the measured job."""
        return self.pin.fingerprint

    def stale_reasons(self, *, device: torch.device | str | None = None) -> list[str]:
        """How the running process differs from the measured one (empty when it matches)."""
        import torch

        reasons = []
        expected = self.fingerprint
        if expected.torch_version and expected.torch_version != torch.__version__:
            reasons.append(f"torch {torch.__version__} (pinned on {expected.torch_version})")
        running_cuda = torch.version.cuda or "none"
        pinned_cuda = expected.cuda_version or "none"
        if running_cuda != pinned_cuda:
            reasons.append(f"CUDA {running_cuda} (pinned on {pinned_cuda})")
        pinned_device = expected.device_name
        if pinned_device and not pinned_device.startswith("cpu") and torch.cuda.is_available():
            name = torch.cuda.get_device_name(torch.device(device) if device else None)
            if name != pinned_device:
                reasons.append(f"GPU {name} (pinned on {pinned_device})")
        return reasons

    def check_workload(self, workload_fingerprint: Mapping[str, Any]) -> list[str]:
        """Compare a `workload.fingerprint(...).to_json_dict()` with the pinned one."""
        expected = self.fingerprint.workload
        if expected and expected.get("digest") != workload_fingerprint.get("digest"):
            return [
                f"workload {workload_fingerprint.get('param_count')} params, batch "
                f"{workload_fingerprint.get('batch')} (pinned on {expected.get('param_count')} "
                f"params, batch {expected.get('batch')})"
            ]
        return []

    def compile(
        self,
        model: nn.Module,
        *,
        blocks: Sequence[nn.Module] | None = None,
        mesh: Any = None,
        parallelize: Any = None,
        in_place: bool = False,
    ) -> nn.Module:
        """Apply the pin: the allocator setting (if `load_pinned` could not yet), the trial's
        model changes, block AC on ``blocks`` (found if omitted), then compile with the
        partitioner settings scoped to the model's calls (never set globally).

        With ``in_place=True`` the model itself is returned, its ``forward`` compiled in place
        (`trial.scoped_forward`): for a trainer that holds the model (transformers' `Trainer`,
        Lightning; `budgettune.integrations` does this). Not for a pin measured sharded.

        A pin measured sharded (``world_size`` > 1), applied in a job under torchrun with the
        process group initialised (or given a ``mesh``), is applied as its trials were, on this
        rank: block AC, per-block ``torch.compile(fullgraph=True)``, then ``parallelize(model,
        mesh)`` or `fully_shard` per block and at the root; call it on every rank, before
        building the optimizer.

        Warns with `StalePinWarning` when the parameter count differs from the pinned workload,
        or the job's world size from the pin's (with the measured split of the peak).
        """
        from budgettune.blocks import find_blocks
        from budgettune.trial.dropout import active_dropout, dropout_warning
        from budgettune.trial.recompute import apply_to_model

        pinned_world = self.pin.world_size
        if in_place and (pinned_world > 1 or mesh is not None):
            raise PinnedConfigError(
                f"{self.path}: a pin measured sharded ({pinned_world} ranks) is applied with "
                "pinned.compile(model) on every rank under torchrun, not in place"
            )
        self.apply_allocator(stacklevel=3)
        expected = self.fingerprint.workload.get("param_count")
        count = sum(p.numel() for p in model.parameters())
        if expected and expected != count:
            warnings.warn(
                f"pinned config {self.path or ''} was measured on a model with {expected} "
                f"parameters, this one has {count}: re-run budgettune search",
                StalePinWarning,
                stacklevel=2,
            )
        said = dropout_warning(self.pin.dropout, active_dropout(model))
        if said is not None:
            path = self.path or ""
            warnings.warn(f"pinned config {path}: {said}", StalePinWarning, stacklevel=2)
        if blocks is None and (self.spec.block_ac_every or self.spec.offload_every):
            blocks = find_blocks(model)
        running_world = world_size_from_env()
        if running_world != pinned_world:
            split = self.pin.measured.split
            text = world_size_warning(
                pinned_world=pinned_world,
                running_world=running_world,
                split=None if split is None else split.to_json_dict(),
            )
            warnings.warn(
                f"pinned config {self.path or ''}: {text}", StalePinWarning, stacklevel=2
            )
        said_applied(self.path, type(model).__name__, self.spec.describe())
        if in_place:
            from budgettune.trial.recompute import prepare_model
            from budgettune.trial.scoped_forward import compile_forward_in_place

            prepare_model(model, self.spec, blocks, model_changes=self.model_changes)
            compile_forward_in_place(model, self.spec, blocks_compiled=self.spec.compiles_blocks)
            return model
        mesh = mesh if mesh is not None else sharded_mesh(model, pinned_world, running_world)
        if mesh is not None:
            return apply_sharded(
                model,
                self.spec,
                mesh,
                blocks=blocks,
                parallelize=parallelize,
                model_changes=self.model_changes,
            )
        return apply_to_model(model, self.spec, blocks, model_changes=self.model_changes)

    def optimizer(
        self, optimizer: torch.optim.Optimizer, *, in_place: bool = False
    ) -> torch.optim.Optimizer:
        """The same optimizer rebuilt with the pinned implementation flag (as written: itself).

        With ``in_place=True`` the optimizer itself is initialised again with the flag and
        returned, so a trainer's references to it (and a scheduler's) stay valid.
        """
        from budgettune.trial.optimizers import rebuild_optimizer, rebuild_optimizer_in_place

        if in_place:
            rebuild_optimizer_in_place(optimizer, self.spec.optimizer_impl)
            return optimizer
        return rebuild_optimizer(optimizer, self.spec.optimizer_impl)


log = logging.getLogger("budgettune.pin")


def said_applied(path: str | None, model: str, config: str) -> None:
    """One INFO line when a pin is applied (issue 47: applying one was silent): through
    logging, and straight to stderr when the job configured no logging (whose last-resort
    handler would drop an INFO line)."""
    text = f"budgettune: applying pin {path or '(in memory)'} to {model}: {config}"
    if logging.getLogger().handlers or log.hasHandlers():
        log.info(text)
    else:
        print(text, file=sys.stderr)


def parse_pin(data: Any, *, source: str = "") -> PinnedConfig:
    """Validate a pinned document: its schema version, its spec, and `PinFields`.

    Raises:
        PinnedConfigError: wrong schema version, an invalid spec, or a field missing or of the
            wrong type or range (one line naming it).
    """
    if not isinstance(data, dict):
        raise PinnedConfigError(f"{source}: a pinned config is a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PinnedConfigError(
            f"{source}: pinned config schema version {version!r} is not supported "
            f"(this budgettune reads version {SCHEMA_VERSION}); re-export it with "
            "`budgettune export` from a matching budgettune"
        )
    if not isinstance(data.get("spec"), dict):  # a list [] read as the default spec
        raise PinnedConfigError(f"{source}: invalid pinned spec: it must be a JSON object")
    try:
        TrialSpec.from_json_dict(data["spec"])
    except (KeyError, TypeError, SpecError) as exc:
        raise PinnedConfigError(f"{source}: invalid pinned spec: {exc}") from None
    problem = first_problem(PinFields, data)
    if problem is not None:
        found = "is missing" if problem.missing else f"is {data[problem.key]!r}"
        raise PinnedConfigError(
            f"{source}: the pin's {problem.key} {found}; it must be {problem.allowed} "
            "(re-export the pin with `budgettune export`)"
        )
    try:
        pin = PinDocument.from_json_dict(data)
        check_model_changes(pin.model_changes)  # verify passed them, compile raised (issue 48)
        figures_problem = check_figures(pin)
    except (
        KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError,
        SpecError,
    ) as exc:  # fmt: skip
        raise PinnedConfigError(
            f"{source}: the pin cannot be read: {one_line(exc, with_type=True)} (re-export "
            "the pin with `budgettune export`)"
        ) from None
    if figures_problem is not None:
        raise PinnedConfigError(
            f"{source}: the pin's {figures_problem} (re-export the pin with `budgettune export`)"
        )
    return PinnedConfig(pin=pin, document=data, path=source)


def load_pinned(
    path: str | Path, *, warn: bool = True, apply_allocator: bool = True
) -> PinnedConfig:
    """Read a pinned config JSON, give the process its allocator setting, and warn
    (`StalePinWarning`) when torch, CUDA or the GPU differ from the measured job's.

    Call it before anything touches CUDA (before the model goes to the GPU): the allocator
    setting (``expandable_segments:True``) then reaches every segment, as in the trial.

    Args:
        path: the pinned JSON.
        warn: warn about a stale fingerprint.
        apply_allocator: set the pin's ``cuda_alloc_conf`` now (False: only read the file).

    Raises:
        PinnedConfigError: a missing, corrupt or other-schema file.
    """
    from budgettune.pinning.output import read_pin_bytes

    source = str(path)[:200]
    try:
        data = json.loads(read_pin_bytes(path))
    except FileNotFoundError:
        raise PinnedConfigError(f"{source}: no such pinned config") from None
    except TypeError as exc:  # load_pinned(5): not a path
        raise PinnedConfigError(f"load_pinned: {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:  # undecodable, too deep, huge ints
        text = one_line(exc, with_type=True)
        raise PinnedConfigError(f"{source}: not a readable pinned config JSON ({text})") from None
    pinned = parse_pin(data, source=source)
    if apply_allocator:  # before the fingerprint check, which may start CUDA
        pinned.apply_allocator(stacklevel=3)
    if warn:
        reasons = pinned.stale_reasons()
        if reasons:
            warnings.warn(
                f"pinned config {source} was measured elsewhere: running on "
                + "; ".join(reasons)
                + ". Its memory figures may not hold: re-run `budgettune verify` or search",
                StalePinWarning,
                stacklevel=2,
            )
    return pinned
