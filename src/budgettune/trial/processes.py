"""Starting budgettune's child processes, waiting for a trial child and ending what it leaves
behind in its session.

Every child (a trial, a sharded trial's rank, a study worker of ``--gpus``) starts through
`spawn`: stdin closed, killed with its parent (Linux), a Ctrl-C landing mid-fork kept.

A trial child leaves with ``os._exit`` once its result is written (the interpreter's teardown
cost seconds per run on a GPU host), so torch's compile workers may outlive it for a moment.
The child runs in a session of its own; once it has exited, and before it is reaped (a zombie
keeps its pid, hence its process-group id, from being reused), the whole group is killed.
SIGINT and SIGTERM reach the parent as exceptions (`Terminated` for SIGTERM), so whatever
waits for a child ends it on the way out.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import IO, NoReturn

_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux only; a child's pre-exec hook).

    A search killed with SIGKILL must not leave its trial running on the GPU.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    command: Sequence[str],
    *,
    output: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a child process the way budgettune starts each of its own.

    Args:
        command: the command line.
        output: where its stdout and stderr go (a log file); None: this process's own.
        env: its environment; None: this process's.
        new_session: start it in a session (and process group) of its own, so that
            `end_session` ends whatever it leaves behind.

    Returns:
        The running process; its stdin is closed, and it is killed when this process dies
        (Linux). A Ctrl-C that lands while it is forked is raised here (`interrupts_kept`).
    """
    with interrupts_kept():
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env=None if env is None else dict(env),
            start_new_session=new_session,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )


def wait_unreaped(process: subprocess.Popen[bytes], timeout_s: float | None) -> bool:
    """Wait until ``process`` exits (True) or ``timeout_s`` passes (False), without reaping it.

    Where ``os.waitid`` is missing (not Linux), it is reaped (``Popen.wait``) instead.
    """
    if not hasattr(os, "waitid"):
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    flags = os.WEXITED | os.WNOWAIT | os.WNOHANG
    while True:
        try:
            if os.waitid(os.P_PID, process.pid, flags) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``process`` leads (its own, if started in a new session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def end_session(process: subprocess.Popen[bytes], timeout_s: float | None = None) -> int | None:
    """Kill what is left of its group (all of it, when it still runs), then reap it.

    Returns:
        Its return code; None when it is not reaped within ``timeout_s``.
    """
    kill_group(process)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like a Ctrl-C where Python runs signal handlers (`sigterm_raises`), so
    every cleanup an interrupt runs runs for it too: the trial's process tree ended, the
    running trial queued again, one line, exit 143."""


def raise_terminated(signum: int, frame: FrameType | None) -> NoReturn:
    """The SIGTERM handler of `sigterm_raises`."""
    raise Terminated(f"terminated by {signal.Signals(signum).name}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside this, SIGTERM raises `Terminated` (in the main thread, where handlers run)
    instead of ending the process at once with nothing said and the trial left RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_RAISING_HANDLERS: dict[int, Callable[[int, FrameType | None], NoReturn]] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: raise_terminated,
}
"""The handlers whose exception `interrupts_kept` raises again when a fork swallowed it."""


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """Start a child inside this: a Ctrl-C (or a SIGTERM under `sigterm_raises`) that lands
    while it is forked is not lost.

    With a ``preexec_fn``, CPython runs its at-fork hooks in the parent (logging's lock release
    among them), and a KeyboardInterrupt raised inside one is printed as "Exception ignored"
    and dropped: an interrupted search then ran on to its pin
    (benchmarks/results/README.md#interrupt-at-fork). Here
    the signal is also remembered, and raised again on the way out if it was swallowed. Only
    in the main thread (where Python runs signal handlers), and only while the signal raises.
    """
    kept = {
        signum: handler
        for signum, handler in _RAISING_HANDLERS.items()
        if signal.getsignal(signum) is handler
    }
    if threading.current_thread() is not threading.main_thread() or not kept:
        yield
        return
    seen: list[int] = []

    def remember(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        kept[signum](signum, frame)

    for signum in kept:
        signal.signal(signum, remember)
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
    if seen:
        kept[seen[0]](seen[0], None)
