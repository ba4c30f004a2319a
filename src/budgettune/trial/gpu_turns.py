"""Trials that share a GPU take turns on it: only their compiles overlap.

A trial process spends most of its life compiling, on one CPU core, while its GPU idles
(issue 44: 20-60 s of compile for ~1 s of measured steps). Several trials may therefore share
one GPU if none of them ever runs on it while another does: each holds the GPU's lock (an
``flock`` on a file named by the GPU's UUID, so every budgettune process on the host agrees)
whenever it may put work on the GPU, and gives it up only while torch compiles (dynamo's
compile callbacks: a frame traced, or a backward compiled lazily), having first waited for
its own queued GPU work. While a trial measures (its memory step and timed steps) the other
trials on the GPU are paused (SIGSTOP to their process groups, SIGCONT after), so that its
CPU is as quiet as when it runs alone. What a shared trial measures is what it would measure
alone: its own allocator peaks, its own process's device memory (NVML, per process), GPU
time with nothing else on the GPU.

Compiles that measure on the GPU (``max-autotune`` modes benchmark kernels while compiling)
keep the lock: they never overlap another trial. The paused trials' groups are written to
the run folder (`PAUSED_FILE`) while they are paused, so that the launcher can resume them if
this trial is killed in the middle (`resume_paused`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from budgettune.trial.phases import PhaseClock

logger = logging.getLogger(__name__)

PAUSED_FILE = "PAUSED.json"
"""In a shared trial's run folder while it has other trials paused: their process groups."""
COMPILE_APART_MODES = frozenset({"default", "reduce-overhead"})
"""Compile modes whose compile puts no work on the GPU (cudagraphs record when run)."""
PAUSE_ENV = "BUDGETTUNE_GPU_TURNS_PAUSE"
"""``0``: a measuring trial does not pause the others (for benchmarks/gpu_turns.py's A/B of
what the pause is worth); anything else, or unset: it does."""


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), to tell it from a later one that
    reuses its id; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class GpuTurns:
    """This process's turns on a GPU it shares with other trials."""

    def __init__(
        self,
        device: Any,
        *,
        clock: PhaseClock,
        run_dir: Path,
        compile_apart: bool,
        gpu_id: str | None = None,
    ):
        """Join the GPU's turns (not holding the lock yet: `take`).

        Args:
            device: the trial's CUDA device (CUDA started on it).
            clock: where the waits for the lock are counted (``gpu_wait``).
            run_dir: the trial's run folder (for `PAUSED_FILE`).
            compile_apart: give the lock up while compiling (False: hold it throughout).
            gpu_id: what names the GPU's lock; default: its UUID (every process that uses
                the GPU, whatever its ``CUDA_VISIBLE_DEVICES``, finds the same lock).
        """
        import torch

        self.device = device
        self.clock = clock
        self.paused_file = run_dir / PAUSED_FILE
        if gpu_id is None:
            gpu_id = str(torch.cuda.get_device_properties(device).uuid)
        stem = Path(tempfile.gettempdir()) / f"budgettune-gpu-{os.getuid()}-{gpu_id}"
        self.members = stem.with_name(stem.name + ".members")
        self.members.mkdir(exist_ok=True)
        self._fd = os.open(stem.with_name(stem.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self.held = False
        self.group = os.getpgid(0)
        self._member = self.members / str(self.group)
        self._member.write_text(_start_time(self.group) or "")
        self._callbacks: tuple[Any, Any] | None = None
        self._alone = False
        if compile_apart:
            self._install_callbacks()

    # -- the lock ----------------------------------------------------------------------------
    def take(self) -> None:
        """Wait for the GPU (counted as ``gpu_wait``)."""
        if self.held:
            return
        started = time.monotonic()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.held = True
        self.clock.add("gpu_wait", time.monotonic() - started)

    def give(self) -> None:
        """Let another trial on the GPU, once this one's queued work is done."""
        if not self.held:
            return
        import torch

        if getattr(self.device, "type", None) == "cuda":
            torch.cuda.synchronize(self.device)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.held = False

    def _install_callbacks(self) -> None:
        from torch._dynamo.callback import callback_handler

        apart = _compile_triggers()

        def started(args: Any = None) -> None:
            if self._alone:  # a recompile while measuring: keep the GPU, the window is its
                return
            if apart is None or getattr(args, "callback_trigger", None) in apart:
                self.give()

        def ended(args: Any = None) -> None:
            self.take()

        callback_handler.register_start_callback(started)
        callback_handler.register_end_callback(ended)
        self._callbacks = (started, ended)

    # -- measuring alone ---------------------------------------------------------------------
    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Hold the GPU and pause the other trials sharing it while the body runs."""
        self.take()
        paused = self._pause_others() if os.environ.get(PAUSE_ENV, "1") != "0" else []
        self._alone = True
        try:
            yield
        finally:
            self._alone = False
            _resume(paused)
            self.paused_file.unlink(missing_ok=True)

    def _pause_others(self) -> list[int]:
        others = []
        for entry in self.members.iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.group:
                continue
            group = int(entry.name)
            try:
                recorded = entry.read_text()
            except OSError:
                continue
            if not recorded or _start_time(group) != recorded:
                entry.unlink(missing_ok=True)  # gone (killed): its id may be another's now
                continue
            others.append(group)
        if not others:
            return []
        self.paused_file.write_text(json.dumps(others))
        paused = []
        for group in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGSTOP)
                paused.append(group)
        return paused

    def close(self) -> None:
        """Leave the GPU's turns: the lock given up, the compile callbacks removed."""
        if self._callbacks is not None:
            from torch._dynamo.callback import callback_handler

            callback_handler.remove_start_callback(self._callbacks[0])
            callback_handler.remove_end_callback(self._callbacks[1])
            self._callbacks = None
        self._member.unlink(missing_ok=True)
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False
        os.close(self._fd)


def _compile_triggers() -> frozenset[Any] | None:
    """The compile callbacks' triggers that mean "compiling now" (a frame traced, a backward
    compiled lazily; not a kernel autotuned or a CUDA graph recorded as it runs); None on a
    torch whose callbacks do not say (every callback is a compile then)."""
    try:
        from torch._dynamo.callback import CallbackTrigger
    except ImportError:
        return None
    return frozenset(
        getattr(CallbackTrigger, name)
        for name in ("DYNAMO", "LAZY_BACKWARD")
        if hasattr(CallbackTrigger, name)
    )


def _resume(groups: list[int]) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGCONT)


def resume_paused(run_dir: str | os.PathLike[str]) -> None:
    """Resume the trials a killed shared trial left paused (the launcher, once it ended)."""
    path = Path(run_dir) / PAUSED_FILE
    try:
        groups = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(groups, list):
        _resume([g for g in groups if isinstance(g, int) and not isinstance(g, bool)])
    path.unlink(missing_ok=True)
