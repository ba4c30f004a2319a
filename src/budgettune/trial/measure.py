"""The measurement recipe: warm-up, one memory-measured step, N timed steps.

`measure` dispatches to `measure_cuda` or `measure_cpu`. No file I/O; the result is a
`results.Measurement`. `torch.cuda.OutOfMemoryError` and `NonFiniteLossError` are not caught
here: the trial child catches them by type.

CPU peak memory is the bytes live at the window's start (`steady_bytes`: unique storages of
parameters, buffers, gradients, optimizer state and the batch; torch has no CPU allocator
statistics) plus the profiler window's running-total peak (`cpu_memory`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.errors import NonFiniteLossError, SharedGpuError
from budgettune.trial.accumulation import CpuClock, CudaClock, timed_apart
from budgettune.trial.cpu_memory import profile_cpu_step
from budgettune.trial.devices import process_used_bytes
from budgettune.trial.host_window import host_window, start_host_window
from budgettune.trial.results import PHASES, Measurement

if TYPE_CHECKING:
    import torch

    from budgettune.trial.phases import PhaseClock
    from budgettune.trial.recompute import PreparedStep
    from budgettune.trial.spec import TrialSpec

log = logging.getLogger(__name__)

_NORM_CHUNK_NUMEL = 1 << 22  # float64 chunks of 32 MB: the grad norm must not set a peak


@dataclass(frozen=True, kw_only=True, slots=True)
class FirstStep:
    """What the warm-up records."""

    compile_s: float
    """Wall time of the first step (compilation happens there)."""
    loss: float
    """Loss of the first step."""
    grad_norm: float
    """Global L2 norm of the first step's gradients (float64 accumulation)."""


def measure(
    step: PreparedStep,
    spec: TrialSpec,
    clock: PhaseClock | None = None,
    alone: Callable[[], AbstractContextManager[None]] | None = None,
) -> Measurement:
    """Run the recipe on the step's device.

    Args:
        step: a prepared step (`recompute.prepare`), not yet run.
        spec: its spec (warm-up and timed step counts).
        clock: lapped at ``compile`` (the first step), ``warmup`` and ``measure``.
        alone: entered around the memory-measured and timed steps on CUDA (a shared GPU's
            `GpuTurns.alone`: nothing else runs on the GPU, the other trials paused).

    Returns:
        The figures; all memory figures are absolute bytes.

    Raises:
        torch.cuda.OutOfMemoryError: passed through.
    """
    if step.device.type == "cuda":
        return measure_cuda(step, spec, clock, alone)
    return measure_cpu(step, spec, clock)


# --------------------------------------------------------------------------- shared parts


def global_grad_norm(parameters: Any) -> float:
    """L2 norm over all gradients, accumulated in float64 chunk by chunk (0.0 without grads)."""
    import torch

    total: torch.Tensor | None = None
    sharded = False
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        if hasattr(grad, "to_local"):  # a DTensor shard (FSDP2): the norm is summed over ranks
            grad, sharded = grad.to_local(), True
        if grad.is_sparse:
            grad = grad.coalesce().values()
        for chunk in grad.detach().reshape(-1).split(_NORM_CHUNK_NUMEL):
            part = chunk.to(torch.float64).square().sum()
            total = part if total is None else total + part
    if sharded:
        import torch.distributed as dist

        total = (
            torch.zeros((), dtype=torch.float64, device=grad.device) if total is None else total
        )
        dist.all_reduce(total)
    return 0.0 if total is None else math.sqrt(float(total.item()))


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _lap(clock: PhaseClock | None, phase: str) -> None:
    if clock is not None:
        clock.lap(phase)


def warm_up(step: PreparedStep, spec: TrialSpec, clock: PhaseClock | None = None) -> FirstStep:
    """Run ``spec.warmup_steps`` full steps; record the first one's time, loss and grad norm
    (of its first forward+backward pass, when it accumulates).

    Raises:
        NonFiniteLossError: the first loss or grad norm is NaN or infinite (before the
            optimizer step: figures of a diverged step could never be pinned).
    """
    _synchronize(step.device)
    start = time.perf_counter()
    loss = step.forward_loss()
    step.backward(loss)
    first_loss = float(loss.detach().float().item())
    grad_norm = global_grad_norm(step.model.parameters())
    del loss
    if not (math.isfinite(first_loss) and math.isfinite(grad_norm)):
        raise NonFiniteLossError(
            f"first-step loss {first_loss:g}, grad norm {grad_norm:g}: not finite, so nothing "
            "measured under this configuration can be pinned; if every configuration does "
            "this, check the workload's loss, data and learning rate"
        )
    for _ in range(step.spec.accum_steps - 1):
        step.forward_backward()  # the gradients kept between passes, as the job accumulates
    step.optimizer_step()
    _synchronize(step.device)
    compile_s = time.perf_counter() - start
    _lap(clock, "compile")
    for _ in range(spec.warmup_steps - 1):
        step.run_step()
    _synchronize(step.device)
    _lap(clock, "warmup")
    return FirstStep(compile_s=compile_s, loss=first_loss, grad_norm=grad_norm)


def _percentiles_ms(times_ms: list[float]) -> tuple[float, float, float]:
    """Median, p10, p90 (inclusive method; a single sample is all three)."""
    if len(times_ms) == 1:
        return times_ms[0], times_ms[0], times_ms[0]
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return statistics.median(times_ms), deciles[0], deciles[-1]


def _peak_phase(phase_peaks: dict[str, int]) -> str:
    """The phase holding the peak (the earliest on a tie)."""
    return max(PHASES, key=lambda phase: (phase_peaks[phase], -PHASES.index(phase)))


def steady_tensor_bytes(step: PreparedStep) -> int:
    """Bytes of the unique storages of params, buffers, grads, optimizer state and the batch."""
    return live_tensor_bytes(
        step.device.type, model=step.model, optimizer=step.optimizer, batch=step.batch
    )


def live_tensor_bytes(device_type: str, *, model: Any, optimizer: Any, batch: Any) -> int:
    """Bytes of the unique storages on ``device_type`` of a model's parameters, buffers and
    gradients, an optimizer's state and a batch pytree (each may be None)."""
    import torch
    import torch.utils._pytree as pytree

    tensors: list[torch.Tensor] = []
    if model is not None:
        tensors += [*model.parameters(), *model.buffers()]
        tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values() if optimizer is not None else ():
        tensors += [v for v in pytree.tree_leaves(state) if isinstance(v, torch.Tensor)]
    tensors += [v for v in pytree.tree_leaves(batch) if isinstance(v, torch.Tensor)]
    storages: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard is what it holds
            tensor = tensor.to_local()
        if tensor.device.type != device_type:
            continue
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


# --------------------------------------------------------------------------- CPU


def _measurement(
    first: FirstStep,
    *,
    allocated: int,
    reserved: int,
    device: int,
    steady: int,
    phase_peaks: dict[str, int],
    times_ms: list[float],
    host: tuple[int, int] = (0, 0),
    split: tuple[float, float] | None = None,
) -> Measurement:
    """Assemble a `Measurement` (shared by the CPU and CUDA recipes); ``split``: the median
    forward+backward pass and optimizer step of an accumulating step, timed apart."""
    median, p10, p90 = _percentiles_ms(times_ms)
    return Measurement(
        forward_backward_ms=None if split is None else split[0],
        optimizer_ms=None if split is None else split[1],
        host_peak_bytes=host[0],
        offload_bytes=host[1],
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        peak_device_bytes=device,
        steady_bytes=steady,
        phase_peak_bytes=phase_peaks,
        peak_phase=_peak_phase(phase_peaks),
        step_time_ms=median,
        step_time_p10_ms=p10,
        step_time_p90_ms=p90,
        compile_s=first.compile_s,
        loss=first.loss,
        grad_norm=first.grad_norm,
    )


def measure_cpu(
    step: PreparedStep, spec: TrialSpec, clock: PhaseClock | None = None
) -> Measurement:
    """The CPU recipe: profiler allocator events for memory, `perf_counter` for time."""
    first = warm_up(step, spec, clock)
    steady = steady_tensor_bytes(step)
    start_host_window(step)
    window = profile_cpu_step(step)
    host = host_window(step)
    phase_peaks = {phase: steady + window.phase_peak_bytes[phase] for phase in PHASES}
    peak = steady + window.window_peak_bytes
    if step.spec.accum_steps > 1:
        times_ms, split = timed_apart(step, spec.timed_steps, CpuClock())
    else:
        times_ms, split = [], None
        for _ in range(spec.timed_steps):
            start = time.perf_counter()
            step.run_step()
            times_ms.append((time.perf_counter() - start) * 1e3)
    _lap(clock, "measure")
    return _measurement(
        first,
        allocated=peak,
        reserved=peak,
        device=peak,
        steady=steady,
        phase_peaks=phase_peaks,
        times_ms=times_ms,
        host=host,
        split=split,
    )


# --------------------------------------------------------------------------- CUDA


def non_pytorch_device_bytes(device: torch.device, *, shared: bool = False) -> int:
    """Device memory of this process that PyTorch's allocator does not hold (context, libraries).

    Read at a quiet point: NVML's per-process figure when the driver gives it (not in some
    containers or under MIG), else the device-wide ``total - free`` (which counts other
    processes too), minus `memory_reserved`.

    Raises:
        SharedGpuError: ``shared`` (other trials hold memory on the GPU) and NVML gives no
            per-process figure: the device-wide one would count theirs.
    """
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(device)
    used = process_used_bytes(index)
    if used is None and shared:
        raise SharedGpuError(
            "trials share this GPU (--trials-per-gpu), but NVML gives no per-process memory "
            "figure here (a container or MIG), and the GPU-wide figure would count the other "
            "trials' memory: run with --trials-per-gpu 1"
        )
    if used is None:
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
    return max(0, used - torch.cuda.memory_reserved(device))


def measure_cuda(
    step: PreparedStep,
    spec: TrialSpec,
    clock: PhaseClock | None = None,
    alone: Callable[[], AbstractContextManager[None]] | None = None,
) -> Measurement:
    """The CUDA recipe: allocator peaks per phase, NVML for the rest, CUDA events for time."""
    first = warm_up(step, spec, clock)
    with (alone or contextlib.nullcontext)():
        return _measure_cuda_window(step, spec, clock, first, shared=alone is not None)


def _measure_cuda_window(
    step: PreparedStep,
    spec: TrialSpec,
    clock: PhaseClock | None,
    first: FirstStep,
    *,
    shared: bool,
) -> Measurement:
    import torch

    device = step.device
    torch.cuda.synchronize(device)
    steady = torch.cuda.memory_allocated(device)
    non_pytorch = non_pytorch_device_bytes(device, shared=shared)
    phase_peaks: dict[str, int] = {}
    reserved_peak = 0

    def close_phase(phase: str) -> None:
        nonlocal reserved_peak
        torch.cuda.synchronize(device)
        allocated = torch.cuda.max_memory_allocated(device)
        phase_peaks[phase] = max(phase_peaks.get(phase, 0), allocated)
        reserved_peak = max(reserved_peak, torch.cuda.max_memory_reserved(device))
        torch.cuda.reset_peak_memory_stats(device)

    torch.cuda.reset_peak_memory_stats(device)
    start_host_window(step)
    # accumulating, the passes after the first run with the gradients held: every pass is
    # in the window, each phase's peak the highest of its passes
    for _ in range(step.spec.accum_steps):
        loss = step.forward_loss()
        close_phase("forward")
        step.backward(loss)
        del loss
        close_phase("backward")
    step.optimizer_step()
    close_phase("optimizer")
    peak = max(phase_peaks.values())
    host = host_window(step)

    with torch.cuda.device(device):  # events record on the current stream of this device
        if step.spec.accum_steps > 1:
            times_ms, split = timed_apart(step, spec.timed_steps, CudaClock())
        else:
            times_ms, split = [], None
            for _ in range(spec.timed_steps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                step.run_step()
                end.record()
                end.synchronize()
                times_ms.append(float(start.elapsed_time(end)))
    _lap(clock, "measure")
    return _measurement(
        first,
        allocated=peak,
        reserved=reserved_peak,
        device=reserved_peak + non_pytorch,
        steady=steady,
        phase_peaks=phase_peaks,
        times_ms=times_ms,
        host=host,
        split=split,
    )
