"""CPU peak memory of one step, from the profiler's allocator events.

The default CPU allocator reports every allocation and free to the profiler while
``profile_memory=True`` (c10's ``ProfiledCPUMemoryReporter``); a free is reported only for a
block allocated while profiling, so the running sum of the ``[memory]`` events from the raw
kineto results (``prof.profiler.kineto_results.events()``; ``prof.events()`` folds allocations
into ops) is exactly "bytes allocated inside the window and still live". Phases are separated
by ``record_function`` markers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.trial.results import PHASES

if TYPE_CHECKING:
    from budgettune.trial.recompute import PreparedStep

_MARKER_PREFIX = "budgettune::"


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuStepMemory:
    """Allocator figures of one CPU step, relative to the bytes live at the window's start."""

    window_peak_bytes: int
    """Peak of the running total of allocations minus frees inside the window."""
    phase_peak_bytes: dict[str, int]
    """The running-total peak within each phase (relative, like `window_peak_bytes`)."""
    num_memory_events: int
    """How many allocator events the profiler recorded."""


def profile_cpu_step(
    step: PreparedStep,
    *,
    on_window_start: Callable[[], None] | None = None,
    on_window_end: Callable[[], None] | None = None,
) -> CpuStepMemory:
    """Run one full step under the profiler and sum its allocator events.

    Args:
        step: a warmed-up step.
        on_window_start: called inside the profiler just before the step (tests read RSS here).
        on_window_end: called inside the profiler just after the step.

    Returns:
        Window and per-phase running-total peaks, relative to the window's start.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if on_window_start is not None:
            on_window_start()
        # accumulating, the passes after the first run with the gradients held: every pass
        # is in the window, each phase's peak the highest of its passes
        for _ in range(step.spec.accum_steps):
            with record_function(_MARKER_PREFIX + "forward"):
                loss = step.forward_loss()
            with record_function(_MARKER_PREFIX + "backward"):
                step.backward(loss)
                del loss
        with record_function(_MARKER_PREFIX + "optimizer"):
            step.optimizer_step()
        if on_window_end is not None:
            on_window_end()

    markers: list[tuple[int, str]] = []
    memory: list[tuple[int, int]] = []
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        if name == "[memory]":
            if event.device_type() == DeviceType.CPU:
                memory.append((event.start_ns(), event.nbytes()))
        elif name.startswith(_MARKER_PREFIX) and name[len(_MARKER_PREFIX) :] in PHASES:
            markers.append((event.start_ns(), name[len(_MARKER_PREFIX) :]))
    missing = [phase for phase in PHASES if phase not in {phase for _, phase in markers}]
    if missing:
        raise RuntimeError(f"the profiler recorded no marker for phase(s) {missing}")
    memory.sort()
    return _phase_peaks(memory, markers)


def cpu_memory_events(prof: Any) -> list[tuple[int, int]]:
    """The CPU allocator's ``(time_ns, bytes)`` events a `torch.profiler.profile` recorded with
    ``profile_memory=True`` (frees negative), in time order."""
    from torch.autograd import DeviceType

    return sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
    )


def running_peak_bytes(memory: list[tuple[int, int]]) -> int:
    """The peak of the running total of time-ordered allocator events (0 when it never rose)."""
    running = peak = 0
    for _, nbytes in memory:
        running += nbytes
        peak = max(peak, running)
    return peak


def _phase_peaks(memory: list[tuple[int, int]], markers: list[tuple[int, str]]) -> CpuStepMemory:
    """Running-total peaks per phase; ``markers``: ``(start_ns, phase)`` of each phase's
    start, a phase possibly more than once (accumulating: two passes), its peak the higher."""
    boundaries = sorted(markers)
    phase_peaks = dict.fromkeys(PHASES, 0)
    running = peak = 0
    index = 0
    for position, (_, phase) in enumerate(boundaries):
        # Events before the first marker count to it; each phase starts at its level so far.
        end_ns = boundaries[position + 1][0] if position + 1 < len(boundaries) else None
        phase_peak = running
        while index < len(memory) and (end_ns is None or memory[index][0] < end_ns):
            running += memory[index][1]
            phase_peak = max(phase_peak, running)
            index += 1
        phase_peaks[phase] = max(phase_peaks[phase], phase_peak)
        peak = max(peak, phase_peak)
    return CpuStepMemory(
        window_peak_bytes=peak, phase_peak_bytes=phase_peaks, num_memory_events=len(memory)
    )
