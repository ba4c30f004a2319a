"""The host's CPU-trial lock: one CPU trial at a time per host, waited for within a limit.

Two CPU trials side by side time each other's contention, not the configuration
(benchmarks/results/README.md#cpu-trial-lock), so every CPU trial of every worker, search
and `budgettune trial` on a host holds this `flock` while its child runs.

The file sits in the shared temp folder, where any user can put a file or a symbolic link under
its name first. So it is opened without following links and read-only (``flock`` needs no
write access), created with the user's umask, and never changed (no chmod, no writes). Where
the shared name is not a plain file, or another user's file cannot be read, the user locks a
file of their own beside it (``budgettune-cpu-UID.lock``), which must be a plain file they own.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from types import TracebackType

from budgettune.errors import UsageError

logger = logging.getLogger(__name__)
"""The wait's one line goes here at INFO; the CLI shows this logger's INFO lines without -v."""

CPU_LOCK_ENV = "BUDGETTUNE_CPU_LOCK"
"""Environment variable naming the host-wide CPU-trial lock file (default: in the temp dir)."""

_POLL_S = 0.1
_HOLDER_CHARS = 120


class CpuLockTimeout(Exception):
    """The lock stayed taken for the whole wait allowed (the message names it and its holder).

    Raised by `cpu_trial_lock`; `launch_trial` turns it into a ``timeout`` result.
    """

    def __init__(self, message: str, *, waited_s: float) -> None:
        super().__init__(message)
        self.waited_s = waited_s


def cpu_lock_path() -> Path:
    """The file whose lock one CPU trial on this host holds at a time (the shared one)."""
    default = Path(tempfile.gettempdir()) / "budgettune-cpu.lock"
    return Path(os.environ.get(CPU_LOCK_ENV) or default)


class HeldCpuLock:
    """The CPU-trial lock, held; leaving the ``with`` block (or `release`) lets it go."""

    def __init__(self, fd: int, path: Path, waited_s: float) -> None:
        self._fd: int | None = fd
        self.path = path
        """The file locked (the shared one, or this user's own)."""
        self.waited_s = waited_s
        """Seconds spent waiting for another process to let it go."""

    def release(self) -> None:
        """Unlock and close the file (again: nothing)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> HeldCpuLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def cpu_trial_lock(timeout_s: float | None = None) -> HeldCpuLock:
    """Take the host's CPU-trial lock, waiting at most ``timeout_s`` for its holder.

    The lock is taken when this returns (use the result in a ``with`` block). A wait logs one
    INFO line naming the lock and its holder.

    Args:
        timeout_s: how long to wait for another process's lock; None waits without limit.

    Returns:
        The held lock.

    Raises:
        CpuLockTimeout: still taken after ``timeout_s``.
        UsageError: neither the shared lock nor this user's own can be used safely (a symbolic
            link, not a plain file, another user's file), or their folder cannot be made.
    """
    fd, path = _open_lock(cpu_lock_path())
    try:
        waited_s = _acquire(fd, path, timeout_s)
    except BaseException:
        os.close(fd)
        raise
    return HeldCpuLock(fd, path, waited_s)


def _open_lock(shared: Path) -> tuple[int, Path]:
    """A read-only descriptor of the shared lock file, else of this user's own beside it."""
    try:
        shared.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"CPU-trial lock {shared}: cannot make its folder ({exc.strerror or exc}); set "
            f"{CPU_LOCK_ENV} to a file path of yours"
        ) from None
    try:
        return _open_plain(shared, own=False), shared
    except OSError as exc:
        reason = _why(exc)
    personal = shared.with_name(f"{shared.stem}-{os.getuid()}{shared.suffix}")
    logger.info("CPU-trial lock %s %s; using %s", shared, reason, personal)
    try:
        return _open_plain(personal, own=True), personal
    except OSError as exc:
        raise UsageError(
            f"CPU-trial lock {personal} {_why(exc)}; remove it, or set {CPU_LOCK_ENV} to a "
            "file path of yours"
        ) from None


class _NotPlain(OSError):
    """The lock's name is a directory, a FIFO, a device or a socket."""


def _open_plain(path: Path, *, own: bool) -> int:
    """Open ``path`` read-only without following a link, creating it (umask applies) if absent.

    Raises:
        OSError: a link (ELOOP), not a plain file (`_NotPlain`), another user's file where
            ``own`` (EPERM), no access (EACCES).
    """
    # O_NONBLOCK: a FIFO put under the name would block a read-only open until a writer came
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        try:  # O_EXCL: never through a name someone else put there meanwhile
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotPlain(errno.EINVAL, "not a plain file", str(path))
        if own and info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, f"owned by uid {info.st_uid}", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (not followed)"
    if isinstance(exc, _NotPlain):
        return "is not a plain file"
    if exc.errno == errno.EPERM:
        return f"is {exc.strerror}, not yours"
    return f"cannot be opened ({exc.strerror or exc})"


def _acquire(fd: int, path: Path, timeout_s: float | None) -> float:
    """Take the flock on ``fd``, polling until ``timeout_s``; the seconds waited."""
    started = time.monotonic()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        pass
    limit = "without limit" if timeout_s is None else f"up to {timeout_s:g} s"
    logger.info(
        "waiting %s for the CPU-trial lock %s, held by %s (one CPU trial per host)",
        limit,
        path,
        lock_holder(fd),
    )
    while True:
        time.sleep(_POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.monotonic() - started
        except BlockingIOError:
            waited_s = time.monotonic() - started
            if timeout_s is not None and waited_s >= timeout_s:
                raise CpuLockTimeout(
                    f"waited {timeout_s:g} s for the CPU-trial lock {path}, held by "
                    f"{lock_holder(fd)} (one CPU trial runs per host at a time)",
                    waited_s=waited_s,
                ) from None


def lock_holder(fd: int) -> str:
    """Who holds the flock on the file of ``fd``: ``pid N (command)`` from ``/proc/locks``
    (Linux), else ``another process``."""
    info = os.fstat(fd)
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146489 0 EOF"; a waiter's has "->" after "1:"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return f"pid {fields[4]}{_command(fields[4])}"
    return "another process"


def _command(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    command = " ".join(raw.decode(errors="replace").replace("\0", " ").split())
    if len(command) > _HOLDER_CHARS:
        command = command[: _HOLDER_CHARS - 3] + "..."
    return f" ({command})" if command else ""
