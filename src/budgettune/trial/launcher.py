"""Parent side of one trial: a fresh child process, its log file, a timeout, device pinning.

`launch_trial` writes ``SPEC.json``, runs ``python -m budgettune.trial.child SPEC.json
RESULT.json`` in a new process session (so a timeout kills the whole tree), sends its output to
``trial.log`` and turns whatever happened into a `TrialResult`. The parent never imports torch
and never initialises CUDA: only the child touches the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, BinaryIO

from budgettune.errors import SpecError, TrialInfrastructureError
from budgettune.trial.cpu_lock import CpuLockTimeout, cpu_trial_lock
from budgettune.trial.devices import visible_device_env
from budgettune.trial.environment import import_time_env
from budgettune.trial.forkserver import BAD_FORK_EXIT
from budgettune.trial.gpu_turns import resume_paused
from budgettune.trial.op_lists import (
    DEFAULT_ADDABLE_OPS_CPU,
    DEFAULT_ADDABLE_OPS_CUDA,
    DEFAULT_REMOVABLE_OPS,
)
from budgettune.trial.phases import LAUNCHED_AT_ENV, with_exit
from budgettune.trial.processes import spawn
from budgettune.trial.ranks import merge_rank_results, rank_result_path, read_rank_results
from budgettune.trial.results import (
    TrialOutcome,
    TrialResult,
    death_message,
    read_result,
    write_json_atomically,
    write_result_atomically,
)
from budgettune.trial.servers import ChildProcess, ServedChild, SpawnedChild, TrialServers
from budgettune.trial.torchrun import torchrun_command
from budgettune.trial.trial_run import DEFAULT_TRIAL_TIMEOUT_S, TrialRun
from budgettune.workload import preload_modules

logger = logging.getLogger(__name__)

KNOWN_OPS = frozenset(DEFAULT_REMOVABLE_OPS + DEFAULT_ADDABLE_OPS_CUDA + DEFAULT_ADDABLE_OPS_CPU)
"""The default op lists' names, which `check_ops_exist` takes as existing."""

SPEC_FILE = "SPEC.json"
RESULT_FILE = "RESULT.json"
LOG_FILE = "trial.log"


_CHECK_OPS = """
import json, sys
from budgettune.errors import SpecError
from budgettune.trial.partitioner import check_compiled_offload_available
from budgettune.trial.recompute import resolve_ops
ops = sys.argv[1:]
try:
    if ops[:1] == ["--compiled-offload"]:
        ops = ops[1:]
        check_compiled_offload_available()
    resolve_ops(ops)
except SpecError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def check_ops_exist(
    ops: Sequence[str], *, compiled_offload: bool = False, timeout_s: float = 300.0
) -> None:
    """Fail before any trial when an op name does not exist in this torch, or the compiled
    offload is asked for (``compiled_offload``) and this torch lacks it.

    Both need torch, which the parent never imports: a short child process checks, unless
    every op is one of budgettune's own defaults, which each torch it supports (>= 2.6) has
    (issue 44: the check's torch import was 2-5 s before a default search's first trial; the
    trial child resolves every op again, so a default missing from a torch still fails there).

    Raises:
        SpecError: an unknown op (the message names it and how to spell one), or no compiled
            activation offloading in this torch.
    """
    ops = [op for op in ops if op not in KNOWN_OPS]
    if not ops and not compiled_offload:
        return
    flag = ["--compiled-offload"] if compiled_offload else []
    out = subprocess.run(
        [sys.executable, "-c", _CHECK_OPS, *flag, *ops],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        logger.warning("op check exited %s: %s", out.returncode, out.stderr[-2000:])
        return  # the trials will report it with their logs
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            raise SpecError(json.loads(line)["error"])


def launch_trial(
    run: TrialRun,
    *,
    run_dir: str | os.PathLike[str],
    timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
    servers: TrialServers | None = None,
) -> TrialResult:
    """Measure one configuration in a fresh child process.

    Args:
        run: what to measure (written to ``run_dir/SPEC.json``).
        run_dir: folder for this trial's spec, result and log; created if missing.
        timeout_s: wall-clock limit for the whole child; past it the process tree is killed.
            A CPU trial waits at most as long for the host's CPU-trial lock (`cpu_trial_lock`),
            then ends as ``timeout`` without starting.
        extra_env: environment variables added for the child.
        servers: trial servers to fork the child from (a one-rank trial only): it starts with
            torch and its compiler imported (`budgettune.trial.forkserver`). None, or a pool
            that cannot serve: the child is a new process.

    Returns:
        The child's `TrialResult`, or one the parent made for a timeout or a child that died
        without writing its result (``crashed``). ``log_path`` and ``wall_s`` are always set.

    Raises:
        TrialInfrastructureError: the run folder or compile cache could not be made or
            written, before the child started or by the time it crashed (a child whose folder
            went away, or whose disk filled up, says nothing about its configuration).
        KeyboardInterrupt: re-raised after the child's process tree has been killed.
    """
    if Path(run_dir).is_symlink():  # issue 48: never write a trial's files through a link
        error = OSError(errno.ELOOP, "a link: no trial folder is written through one")
        raise TrialInfrastructureError(_fault_line(error, run_dir))
    folder = Path(run_dir).resolve()
    cache_dir = run.cache_dir()
    try:
        if cache_dir is not None:  # made here, so a cache that cannot be made is no crash
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
        result = _run_child(run, folder, timeout_s=timeout_s, extra_env=extra_env, servers=servers)
    except OSError as exc:
        raise TrialInfrastructureError(_fault_line(exc, exc.filename or folder)) from exc
    if result.outcome is TrialOutcome.CRASHED:
        fault = folder_fault(folder, cache_dir)
        if fault is not None:
            raise TrialInfrastructureError(
                f"{fault} (the child ended: {result.error}; log {result.log_path})"
            )
    return result


def folder_fault(*folders: str | os.PathLike[str] | None) -> str | None:
    """Why a trial cannot write its files in one of ``folders`` (gone, not a folder, no
    access, disk full), as one line; None when each takes a small synced file."""
    for folder in folders:
        if folder is None:
            continue
        try:
            fd, probe = tempfile.mkstemp(prefix=".budgettune-probe-", dir=folder)
            try:
                os.write(fd, bytes(4096))
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            return _fault_line(exc, folder)
    return None


def _fault_line(exc: OSError, path: str | os.PathLike[str]) -> str:
    return (
        f"a trial could not use {path} ({exc.strerror or type(exc).__name__}): a file system "
        "fault, not its configuration's; check that path and the free space on its disk"
    )


def _run_child(
    run: TrialRun,
    folder: Path,
    *,
    timeout_s: float,
    extra_env: Mapping[str, str] | None,
    servers: TrialServers | None = None,
) -> TrialResult:
    """`launch_trial` without the folder checks (an `OSError` here is the folder's or the
    host's, not the configuration's)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (
        folder / SPEC_FILE,
        folder / RESULT_FILE,
        folder / LOG_FILE,
    )
    result_path.unlink(missing_ok=True)
    for rank in range(run.nproc_per_node):
        rank_result_path(result_path, rank).unlink(missing_ok=True)
    child_device, device_env = visible_device_env(run.device)
    child_run = dataclasses.replace(run, device=child_device)
    # written beside and renamed: a SPEC.json planted as a link replaces the link, never its
    # target (issue 48: whoever can write a shared runs folder could clobber others' files)
    write_json_atomically(spec_path, child_run.to_json_dict())

    env = child_env(run, device_env, extra_env)
    command = [sys.executable, "-m", "budgettune.trial.child", str(spec_path), str(result_path)]
    if run.nproc_per_node > 1:
        command = torchrun_command(spec_path, result_path, run.nproc_per_node)
    logger.info("trial %s: %s", folder.name, " ".join(command))
    try:  # the wait for the host's one CPU trial at a time is bounded by the trial's timeout
        lock = cpu_trial_lock(timeout_s) if child_device == "cpu" else None
    except CpuLockTimeout as exc:
        with open_log(log_path) as log:
            _log_line(log, f"not started: {exc}")
        return TrialResult(
            outcome=TrialOutcome.TIMEOUT,
            error=str(exc),
            log_path=str(log_path),
            wall_s=exc.waited_s,
        )
    with lock or contextlib.nullcontext(), open_log(log_path) as log:
        if lock is not None and lock.waited_s:
            _log_line(log, f"waited {lock.waited_s:.1f} s for the CPU-trial lock {lock.path}")
        _log_line(log, f"starting {' '.join(command)}")
        started = time.monotonic()
        env[LAUNCHED_AT_ENV] = repr(started)
        process: ChildProcess | None = None
        returncode: int | None = None
        try:
            process = _start(run, command, log, log_path, env, servers)
            if process.wait_unreaped(timeout_s):
                # its compile workers, when it left without stopping them (`processes`)
                returncode = process.end_session()
            else:  # timed out: the whole session goes
                process.end_session(timeout_s=30)
        except BaseException:
            if process is not None:
                process.end_session(timeout_s=30)
            raise
        finally:
            if run.shared_gpu:  # killed while measuring, it may have left others paused
                resume_paused(folder)
        wall_s = time.monotonic() - started
        _log_line(log, f"the child ended ({returncode}) after {wall_s:.1f} s")
    lost = process.lost if isinstance(process, ServedChild) else ""
    if returncode == BAD_FORK_EXIT and isinstance(process, ServedChild) and servers:
        servers.disable("CUDA could not start in a trial server's fork")
        return _run_child(run, folder, timeout_s=timeout_s, extra_env=extra_env)

    def ended(result: TrialResult) -> TrialResult:
        phases = with_exit(result.phases_s, wall_s)
        return result.replace(log_path=str(log_path), wall_s=wall_s, phases_s=phases)

    if returncode is None and lost:
        return ended(TrialResult(outcome=TrialOutcome.CRASHED, error=lost))
    if returncode is None:
        return ended(
            TrialResult(
                outcome=TrialOutcome.TIMEOUT,
                error=f"trial exceeded its {timeout_s:g} s timeout; process tree killed",
            )
        )
    if run.nproc_per_node > 1:
        merged = merge_rank_results(
            read_rank_results(result_path, run.nproc_per_node),
            launcher_error=death_message(returncode, who="trial process") if returncode else "",
        )
        write_result_atomically(result_path, merged)
        return ended(merged)
    try:
        return ended(read_result(result_path))
    except (OSError, ValueError):
        error = death_message(returncode, who="trial process")
        return ended(TrialResult(outcome=TrialOutcome.CRASHED, error=error))


TRIAL_SERVER_ENV = "BUDGETTUNE_TRIAL_SERVER"
"""Set to ``0`` to start every trial as a new process (no trial servers): for a before/after
comparison, or to rule the servers out when a trial misbehaves."""


def trial_servers(run: TrialRun, log_dir: str | os.PathLike[str]) -> TrialServers | None:
    """Trial servers for the one-rank trials of a search or a verify of ``run``'s workload
    (none started yet: the first trial of an environment starts one); None for sharded
    trials or when `TRIAL_SERVER_ENV` is ``0``. The caller closes them."""
    if run.nproc_per_node > 1 or os.environ.get(TRIAL_SERVER_ENV, "1") == "0":
        return None
    return TrialServers(preload=preload_modules(run.workload), log_dir=log_dir)


def run_env(run: TrialRun, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a trial child of ``run`` starts with on ``run.device`` (what picks the
    trial server it forks from: `TrialServers.prestart`)."""
    return child_env(run, visible_device_env(run.device)[1], extra_env)


def child_env(
    run: TrialRun, device_env: Mapping[str, str], extra_env: Mapping[str, str] | None
) -> dict[str, str]:
    """The environment a trial child starts with (what the child's own
    `prepare_process_environment` adds before torch is imported included, when it is read at
    torch's import: the compile caches turned off)."""
    env = dict(os.environ)
    env.update(device_env)
    env.update(extra_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    env.update(import_time_env(run))
    return env


def _start(
    run: TrialRun,
    command: list[str],
    log: IO[bytes],
    log_path: Path,
    env: Mapping[str, str],
    servers: TrialServers | None,
) -> ChildProcess:
    """The child: forked by a trial server when one can serve it, else a new process."""
    if servers is not None and run.nproc_per_node == 1:
        spec_path, result_path = Path(command[-2]), Path(command[-1])
        served = servers.start_child(
            spec_path=spec_path, result_path=result_path, log_path=log_path, env=env
        )
        if served is not None:
            _log_line(log, f"forked by trial server {served.server.process.pid} as {served.pid}")
            return served
    return SpawnedChild(spawn(command, output=log, env=env, new_session=True))


def open_log(path: Path) -> BinaryIO:
    """The trial log, opened to append, never through a symbolic link (``O_NOFOLLOW``: a
    ``trial.log`` planted as a link to another file is an `OSError`, the folder's fault), and
    only as a regular file of one name (``O_NONBLOCK``: one planted as a FIFO does not block
    the open, issue 48's P6-6; a hard link planted there would append to its other name, P9-3)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        why = "not a regular file" if info.st_nlink <= 1 else "a hard link to another file"
        raise OSError(errno.EINVAL, why, str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def _log_line(log: IO[bytes], text: str) -> None:
    """A timestamped line of the launcher's own in the trial log (the child's lines carry the
    same clock): with them the log shows where a run's wall time went, start-up and exit
    included."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    log.write(f"{stamp} INFO budgettune.trial.launcher: {text}\n".encode())
    log.flush()
