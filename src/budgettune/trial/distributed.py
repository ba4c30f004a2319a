"""The sharded side of a trial (and of a pin applied under torchrun): process group, mesh,
and torchtitan's order of block AC → per-block ``torch.compile(fullgraph=True)`` → FSDP2.

Every rank applies the same `TrialSpec` the same way: the partitioner settings are scoped
around each compiled call (`recompute.partitioner_settings`), block AC wraps the same blocks,
the optimizer is rebuilt with the same flag, and the allocator setting is in each rank's
environment before CUDA starts. Sharding is the workload's ``parallelize(model, mesh)`` hook
when it has one, else `fully_shard` on every block (found with `find_blocks` when the workload
does not name them) and at the root, as torchtitan does.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from budgettune.trial.block_ac import apply_block_ac
from budgettune.trial.block_compile import compile_blocks
from budgettune.trial.hf_cache import apply_model_changes, turn_off_kv_cache
from budgettune.trial.offload import ActivationOffload
from budgettune.trial.recompute import (
    PreparedStep,
    build_optimizer,
    check_spec_supported,
    repeated_blocks,
    scoped_module_class,
    wrap_offload,
)
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from budgettune.workload import Workload

logger = logging.getLogger(__name__)

SHARDING_DEFAULT = "fsdp2: fully_shard per block and at the root (torchtitan order)"
SHARDING_HOOK = "the workload's parallelize(model, mesh) hook"


def _int_from_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, str(default)))
    except ValueError:
        return default


def world_size_from_env() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 outside torchrun)."""
    return _int_from_env("WORLD_SIZE", 1)


def world_rank_from_env() -> int:
    """``RANK`` as torchrun sets it (0 outside torchrun)."""
    return _int_from_env("RANK", 0)


@contextlib.contextmanager
def process_group(run: TrialRun) -> Iterator[tuple[torch.device, DeviceMesh]]:
    """Join the trial's process group (gloo on CPU, nccl on CUDA) and build a 1-D mesh.

    Yields:
        This rank's device (``cuda:LOCAL_RANK`` of the GPUs the trial may see) and the mesh.
        The group is destroyed on exit, whatever happened.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    on_cuda = run.device.startswith("cuda")
    device = torch.device("cpu")
    if on_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if on_cuda else "gloo",
        timeout=datetime.timedelta(seconds=run.collective_timeout_s),
        device_id=device if on_cuda else None,
    )
    try:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        yield device, mesh
    finally:
        with contextlib.suppress(Exception):  # a broken group cannot always be torn down
            dist.destroy_process_group()


def collective_errors() -> tuple[type[BaseException], ...]:
    """Exception types of a collective that failed because a peer went away or timed out."""
    import torch.distributed as dist

    return tuple(
        cls
        for cls in (getattr(dist, "DistError", None), getattr(dist, "DistBackendError", None))
        if isinstance(cls, type)
    )


def default_parallelize(model: nn.Module, mesh: DeviceMesh, blocks: Sequence[nn.Module]) -> None:
    """FSDP2 as torchtitan applies it: `fully_shard` each block, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard_model(
    model: nn.Module,
    spec: TrialSpec,
    mesh: DeviceMesh,
    *,
    blocks: Sequence[nn.Module] | None,
    parallelize: Callable[[Any, Any], Any] | None = None,
    model_changes: Sequence[str] = (),
) -> tuple[nn.Module, Callable[..., Any], tuple[str, ...], ActivationOffload | None]:
    """Apply a spec to one rank's model in torchtitan's order: block AC, per-block compile,
    offload around the compiled blocks, then the sharding (``parallelize(model, mesh)``, or
    `default_parallelize`).

    Args:
        model_changes: model changes to make first (a pin's, in a job).

    Returns:
        The sharded model (owns the parameters, now DTensors), what the loss should call, and
        the model changes made (``use_cache=False`` on a transformers model whose blocks are
        checkpointed or compiled one by one: see `hf_cache`), and the offload hooks (None
        when the spec does not offload).

    Raises:
        SpecError: block AC without blocks, or an unsupported spec.
    """
    import torch

    check_spec_supported(spec, mesh.device_type)
    made = apply_model_changes(model, model_changes)
    found = repeated_blocks(spec, model, blocks, "Workload(blocks=...)")
    if found and (spec.block_ac_every or spec.is_compiled):
        made = tuple(dict.fromkeys(made + turn_off_kv_cache(model)))
    if spec.block_ac_every:
        apply_block_ac(found, spec.block_ac_every, spec.block_ac_policy)
    placed = compile_blocks(model, found, spec) if found else []
    offload = None
    if spec.offload_every:  # around the compiled blocks, per rank (each has its own ledger)
        # not the parameters: sharding frees their storage (the gathered ones are Parameters)
        offload = wrap_offload(placed, spec, mesh.device_type, keep=model.buffers())
    if parallelize is not None:
        model = parallelize(model, mesh) or model
    else:
        default_parallelize(model, mesh, placed)
    call: Callable[..., Any] = model
    if spec.is_compiled and not found:
        # No blocks to compile one by one: compile the whole (sharded) model instead.
        backend = spec.compile_backend
        call = torch.compile(model, backend=backend)
    return model, call, made, offload


def prepare_sharded(
    workload: Workload, spec: TrialSpec, device: torch.device, mesh: DeviceMesh
) -> PreparedStep:
    """`recompute.prepare` for a rank of a sharded trial."""
    model, call, changes, offload = shard_model(
        workload.model,
        spec,
        mesh,
        blocks=workload.blocks,
        parallelize=workload.parallelize,
    )
    return PreparedStep(
        offload=offload,
        model_changes=changes,
        model=model,
        compiled=call,
        optimizer=build_optimizer(workload, spec, model.parameters()),
        loss_fn=workload.loss,
        batch=workload.batch,
        autocast_dtype=workload.autocast_dtype,
        device=device,
        spec=spec,
    )


def sharded_mesh(model: nn.Module, pinned_world: int, running_world: int) -> DeviceMesh | None:
    """The 1-D mesh of a job under torchrun, for a pin measured sharded; None when the pin is
    of one rank, the job is not sharded, or its process group is not initialised."""
    import torch.distributed as dist

    if pinned_world < 2 or running_world < 2:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    device_type = next((p.device.type for p in model.parameters()), "cpu")
    return init_device_mesh(device_type, (dist.get_world_size(),))


def apply_sharded(
    model: nn.Module,
    spec: TrialSpec,
    mesh: DeviceMesh,
    *,
    blocks: Sequence[nn.Module] | None = None,
    parallelize: Callable[[Any, Any], Any] | None = None,
    model_changes: Sequence[str] = (),
) -> nn.Module:
    """A pin applied on one rank of a training job: like the trial, plus the scoped settings
    around each call (see `recompute.apply_to_model`)."""
    sharded, call, _, _ = shard_model(
        model, spec, mesh, blocks=blocks, parallelize=parallelize, model_changes=model_changes
    )
    if not spec.is_compiled:
        return sharded
    return scoped_module_class()(sharded, call, spec)  # type: ignore[no-any-return]
