"""Measure one step of a user's own training loop, the way a trial measures its step.

    with pinned.measure_step() as meter:        # budgettune.load_pinned(...).measure_step()
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(meter.result.summary())              # the peak against the pin's

A trial's figures are the third step's (two warm-up steps compile): measure the job's third
step too. On CUDA the peaks are the allocator's over the block and the device peak adds what
the process holds outside it, read at the block's start (`measure.non_pytorch_device_bytes`),
as the trial's recipe does. On CPU the peak is the profiler's allocator events over the block
plus the bytes live at its start, which only the job knows: pass ``model``, ``optimizer`` and
``batch`` (as the trial counts them) or the CPU peak counts the block's allocations alone.
The profiler reports no free of memory allocated before it started, so the gradients live at
the block's start (a loop that zeroes them at the start of its step) are watched: when one is
freed inside the block, its free is added to the events at the time it happened, and the
figure is the same whichever end of the step the loop zeroes at (issue 45: +12.5 % before).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from budgettune.trial.cpu_memory import cpu_memory_events, running_peak_bytes
from budgettune.trial.measure import live_tensor_bytes, non_pytorch_device_bytes
from budgettune.trial.results import MEM_METRICS

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCheck:
    """One measured step of a job, beside the pin's figures."""

    device: str
    """Where the step ran (``cuda:0``, ``cpu``)."""
    peak_allocated_bytes: int
    """Allocator peak of live tensors during the step."""
    peak_reserved_bytes: int
    """Allocator peak of reserved segments (CPU: the allocated peak)."""
    peak_device_bytes: int
    """What the device would show for the process (reserved + context, libraries)."""
    step_time_ms: float
    """Wall time of the block (CUDA synchronised at both ends)."""
    mem_metric: str
    """The pin's memory metric, the one compared."""
    pinned_peak_bytes: int | None
    """The pin's worst measured peak on that metric (this rank's, for a sharded pin)."""
    pinned_step_time_ms: float | None
    """The pin's median step time."""

    @property
    def peak_bytes(self) -> int:
        """The job's peak on the pin's metric."""
        return int(getattr(self, f"peak_{self.mem_metric}_bytes"))

    @property
    def relative_error(self) -> float | None:
        """(job peak / pinned peak) - 1, or None when the pin holds no peak."""
        if not self.pinned_peak_bytes:
            return None
        return self.peak_bytes / self.pinned_peak_bytes - 1.0

    def within(self, tolerance: float = 0.01) -> bool:
        """Whether the job's peak is within ``tolerance`` (relative) of the pin's, or below it."""
        error = self.relative_error
        return error is not None and error <= tolerance

    def summary(self) -> str:
        """One line: the job's peak and time against the pin's."""
        line = f"step peak {self.peak_bytes / 1e9:.3f} GB ({self.mem_metric})"
        if self.pinned_peak_bytes:
            line += (
                f", pin {self.pinned_peak_bytes / 1e9:.3f} GB "
                f"({(self.relative_error or 0.0):+.1%})"
            )
        line += f"; {self.step_time_ms:.1f} ms"
        if self.pinned_step_time_ms:
            line += f", pin {self.pinned_step_time_ms:.1f} ms"
        return line

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form, with the derived figures."""
        return {
            **asdict(self),
            "peak_bytes": self.peak_bytes,
            "relative_error": self.relative_error,
        }


class StepMeter:
    """A context manager that measures the block it wraps (see the module docstring).

    ``result`` holds the `StepCheck` once the block has ended without an exception.
    """

    def __init__(
        self,
        *,
        device: torch.device | str | None = None,
        mem_metric: str = "device",
        pinned_peak_bytes: int | None = None,
        pinned_step_time_ms: float | None = None,
        model: Any = None,
        optimizer: Any = None,
        batch: Any = None,
    ) -> None:
        if mem_metric not in MEM_METRICS:
            raise ValueError(f"mem_metric must be one of {MEM_METRICS}, got {mem_metric!r}")
        self._device_arg = device
        self._mem_metric = mem_metric
        self._pinned = (pinned_peak_bytes, pinned_step_time_ms)
        self._live = (model, optimizer, batch)
        self._profile: Any = None
        self._steady = self._non_pytorch = 0
        self._frees: list[tuple[int, int]] = []
        self._watches: list[weakref.finalize[Any, Any]] = []
        self._start = 0.0
        self.device: torch.device | None = None
        self.result: StepCheck | None = None

    def _resolve_device(self) -> torch.device:
        import torch

        if self._device_arg is not None:
            device = torch.device(self._device_arg)
        else:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def _watch_gradients(self, model: Any) -> None:
        """Record when each gradient live now is freed (``time.time_ns``, the clock of the
        profiler's events), with its bytes as a negative event."""
        if model is None:
            return
        seen: set[int] = set()
        for param in model.parameters():
            grad = param.grad
            if grad is None or grad.device.type != "cpu":
                continue
            storage = grad.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            self._watches.append(weakref.finalize(grad, self._freed, storage.nbytes()))

    def _freed(self, nbytes: int) -> None:
        self._frees.append((time.time_ns(), -nbytes))

    def __enter__(self) -> StepMeter:
        import torch

        self.device = device = self._resolve_device()
        model, optimizer, batch = self._live
        if device.type == "cuda":
            self._non_pytorch = non_pytorch_device_bytes(device)  # synchronises
            torch.cuda.reset_peak_memory_stats(device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._steady = live_tensor_bytes(
                device.type, model=model, optimizer=optimizer, batch=batch
            )
            self._watch_gradients(model)
            self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profile.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        import torch

        device = self.device
        assert device is not None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            elapsed_ms = (time.perf_counter() - self._start) * 1e3
            allocated = int(torch.cuda.max_memory_allocated(device))
            reserved = int(torch.cuda.max_memory_reserved(device))
            device_peak = reserved + self._non_pytorch
        else:
            elapsed_ms = (time.perf_counter() - self._start) * 1e3
            self._profile.__exit__(exc_type, exc, traceback)
            for watch in self._watches:
                watch.detach()  # a free after the block is not the step's
            events = sorted([*cpu_memory_events(self._profile), *self._frees])
            peak = self._steady + running_peak_bytes(events)
            allocated = reserved = device_peak = peak
        if exc_type is not None:
            return
        self.result = StepCheck(
            device=str(device),
            peak_allocated_bytes=allocated,
            peak_reserved_bytes=reserved,
            peak_device_bytes=device_peak,
            step_time_ms=elapsed_ms,
            mem_metric=self._mem_metric,
            pinned_peak_bytes=self._pinned[0],
            pinned_step_time_ms=self._pinned[1],
        )
