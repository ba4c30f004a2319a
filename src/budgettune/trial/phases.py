"""Where a trial process's wall time goes: its phases, from the launcher's start to its end.

The launcher stamps the moment it starts a child (`LAUNCHED_AT_ENV`, a `time.monotonic`
reading: on Linux one clock for every process of the host); the child laps a `PhaseClock`
at each stage, and the launcher adds ``exit`` (from the result written to the child's end).
The phases of a result add up to its ``wall_s``. They say what a search pays besides the
measurement itself (issue 44: a fresh process cost 40-85 s for ~0.5 s of timed steps).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

LAUNCHED_AT_ENV = "BUDGETTUNE_LAUNCHED_AT"
"""The launcher's `time.monotonic` when it started the child (or asked its server to fork it)."""

PHASES = (
    "start",
    "imports",
    "cuda_init",
    "build",
    "prepare",
    "compile",
    "warmup",
    "gpu_wait",
    "measure",
    "result",
    "exit",
)
"""The phases, in order:

- ``start``: from the launcher's start of the child to the child's first line (the interpreter
  starting and importing budgettune; a fork of a trial server makes it milliseconds);
- ``imports``: torch and its compiler (dynamo, inductor) imported (nothing when pre-imported);
- ``cuda_init``: the CUDA context made on the trial's GPU (0 on the CPU);
- ``build``: the workload's builder;
- ``prepare``: the knobs applied, the step wrapped for compile;
- ``compile``: the first step, compilation included (`Measurement.compile_s`);
- ``warmup``: the other warm-up steps;
- ``gpu_wait``: waiting for a GPU shared with other trials to be free (its runs only);
- ``measure``: the memory-measured step and the timed steps;
- ``result``: the result put together (the compile caches' counters logged);
- ``exit``: from then to the child's end, as the launcher saw it (the result file written,
  the process gone).
"""


def launched_at() -> float | None:
    """The launcher's start of this child (`LAUNCHED_AT_ENV`), None when not set or unreadable."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None


class PhaseClock:
    """Laps of one process: each `lap` closes the phase that ran since the previous lap."""

    def __init__(self, origin: float | None = None) -> None:
        """Start the clock at ``origin`` (a `time.monotonic` reading; default: now)."""
        self._last = time.monotonic() if origin is None else origin
        self._seconds: dict[str, float] = {}

    def lap(self, phase: str) -> float:
        """Close ``phase`` now (adding to it, when it ran before); returns its seconds."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        now = time.monotonic()
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._seconds[phase] = self._seconds.get(phase, 0.0) + elapsed
        return elapsed

    def add(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` of the time since the last lap as ``phase`` (the next lap of
        another phase gets the rest): e.g. GPU waits inside the compile."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds
        self._last += seconds

    def seconds(self) -> dict[str, float]:
        """Every phase lapped so far, in `PHASES` order, rounded to milliseconds."""
        return {p: round(self._seconds[p], 3) for p in PHASES if p in self._seconds}


def with_exit(phases: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """``phases`` with ``exit``: what of ``wall_s`` the child's own phases do not cover."""
    out = {p: float(v) for p, v in phases.items() if p != "exit"}
    if out:
        out["exit"] = round(max(0.0, wall_s - sum(out.values())), 3)
    return out


def merge_phases(per_rank: list[Mapping[str, float]]) -> dict[str, float]:
    """A sharded trial's phases: each phase's longest rank (the trial waits for the slowest)."""
    merged: dict[str, float] = {}
    for phases in per_rank:
        for phase, seconds in phases.items():
            merged[phase] = max(merged.get(phase, 0.0), float(seconds))
    return {p: merged[p] for p in PHASES if p in merged}


def check_phases(phases: Mapping[str, object]) -> dict[str, float]:
    """Phases read from a file or a database: known names, finite non-negative seconds, in
    `PHASES` order (JSON files are written with sorted keys).

    Raises:
        ValueError: an unknown phase or a value that is not such a number.
    """
    import math

    if not isinstance(phases, Mapping):
        raise ValueError(f"phases must be a mapping of phase to seconds, got {phases!r}")
    out: dict[str, float] = {}
    for phase, value in phases.items():
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"phase {phase!r} is not a number of seconds: {value!r}")
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"phase {phase!r} is not a number of seconds: {value!r}")
        out[phase] = seconds
    return {phase: out[phase] for phase in PHASES if phase in out}


SEARCH_STARTED_ENV = "BUDGETTUNE_SEARCH_STARTED_AT"
"""The search command's start (a `time.monotonic` reading), given to its workers so that each
says in its log how far into the search it got ready (`startup_line`; issue 44: of the 9.5-15 s
from a search's command to its first trial on an H200 host, the search's own process took
4.0-8.6 s to spawn its workers and each worker 4.1-5.3 s to get ready)."""


def process_started_at() -> float:
    """This process's start as a `time.monotonic` reading (Linux's ``/proc``; elsewhere now)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


def startup_line(who: str, marks: Mapping[str, float]) -> str | None:
    """``who: started 1.2 s after the search command, imported 2.0 s, ...``: each mark (a
    `time.monotonic` reading) against the search's start; None outside a search's workers."""
    try:
        origin = float(os.environ[SEARCH_STARTED_ENV])
    except (KeyError, ValueError):
        return None
    said = ", ".join(f"{name} {at - origin:.1f} s" for name, at in marks.items())
    return f"{who}: {said} after the search command started"
