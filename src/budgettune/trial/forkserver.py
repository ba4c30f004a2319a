"""A trial server: one process that imports torch and its compiler once, then forks each trial.

A fresh trial process spends seconds importing torch, dynamo and inductor (and transformers)
before it measures anything: 48 % of the CPU demo's process time, 8-11 s per process on the
GPU hosts (issue 44). A server pays that once: ``python -m budgettune.trial.forkserver
MODULE...`` imports them (and the workload's own modules that are safe to import: see
`budgettune.workload.preload_modules`), says it is ready, and forks a child for each trial it
is asked to run. The child is a trial process like any other (its own session, its output to
the trial's log, the trial's environment, ``python -m budgettune.trial.child``'s `main`); it
only starts with those modules imported. Nothing else is shared: the server never compiles,
never builds a model and never touches CUDA, which a forked child could not use after it.

The server refuses to serve (and exits) if, after its imports, CUDA was initialised or the
CUDA driver library is loaded; a child that finds itself in a "bad fork" anyway exits with
`BAD_FORK_EXIT` before measuring, and its launcher runs the trial as a fresh process.

The protocol (one JSON object a line; the server reads its stdin, writes its stdout):

- server: ``{"ready": true, "pid": P, "imports_s": S}`` once (or ``{"error": "..."}`` and exit);
- launcher: ``{"spec": ..., "result": ..., "log": ..., "env": {...}}``; server: ``{"pid": C}``;
- server, when the child has exited (not yet reaped, so its process group can still be
  killed safely): ``{"exited": C}``; launcher: ``{"reap": C}``; server: ``{"returncode": R}``.

End of input ends the server, killing a child it still has. It dies with its launcher
(Linux), and its children die with it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

BAD_FORK_EXIT = 97
"""A served child's exit code when CUDA cannot start in it (the server had touched CUDA)."""
COMPILER_MODULES = (
    "torch",
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch._functorch.partitioners",
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.decomposition",
    "torch.utils.checkpoint",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
    "budgettune.trial.child",
    "budgettune.trial.recompute",
    "budgettune.trial.measure",
    "budgettune.trial.block_ac",
    "budgettune.trial.offload",
    "budgettune.workload",
    "setproctitle",
)
"""What every served trial starts with (each one a trial would import anyway)."""

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""Set in the server: its imports' CUDA availability checks ask NVML, not the CUDA driver."""


def _reply(message: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _preload(modules: Sequence[str]) -> list[str]:
    """Import ``modules`` (a missing or failing one is skipped); the names that failed."""
    import importlib

    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - an optional module; the trial will say
            print(f"forkserver: could not import {name}: {exc}", file=sys.stderr)
            failed.append(name)
    return failed


def cuda_touched() -> str:
    """Why this process may not fork trials that use CUDA (empty: it may).

    Torch must not have started CUDA here. Its imports may load the CUDA driver library
    (triton does, for one) without starting it; whether a fork can still start CUDA is then
    tried: a probe child makes a context and says so.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch initialised CUDA"
    try:
        with open("/proc/self/maps") as maps:
            loaded = any("libcuda.so" in line for line in maps)
    except OSError:
        loaded = False
    if loaded and not _fork_can_start_cuda():
        return "the CUDA driver is loaded and a forked probe could not start CUDA"
    return ""


def _fork_can_start_cuda() -> bool:
    """Whether a child forked now can make a CUDA context (on the first visible GPU)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _become_trial(request: Mapping[str, Any], server_pid: int) -> NoReturn:
    """In the forked child: the trial's session, output, signals and environment, then the
    trial child's `main`. Never returns."""
    code = 70
    try:
        os.setsid()  # its own session, so the launcher can end what it leaves behind
        from budgettune.trial.processes import die_with_parent

        die_with_parent()
        if os.getppid() != server_pid:  # the server died between the fork and the line above
            os._exit(code)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        argv = [request["spec"], request["result"]]
        # before the environment is replaced: setproctitle writes over argv and environ's space
        _set_title(" ".join([sys.executable, "-m", "budgettune.trial.child", *argv]))
        os.environ.clear()
        os.environ.update(request["env"])
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda._is_in_bad_fork():  # pragma: no cover - GPU
            print("forkserver: CUDA cannot start in this fork", file=sys.stderr)
            os._exit(BAD_FORK_EXIT)
        from budgettune.trial import child

        sys.argv = [child.__file__, *argv]  # as `python -m budgettune.trial.child` has it
        code = child.main(argv)
    except BaseException:  # noqa: BLE001 - whatever happens, this process must not go on
        import traceback

        traceback.print_exc()
    finally:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _set_title(title: str) -> None:
    """Show the fork as what it is in ``ps`` and ``pgrep -f``: the trial child's command line
    (setproctitle; without it the fork shows the server's)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _serve_one(request: Mapping[str, Any], server_pid: int) -> bool:
    """Fork one trial, report its exit, reap it when told. False when the launcher left."""
    pid = os.fork()
    if pid == 0:
        _become_trial(request, server_pid)
    _reply({"pid": pid})
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    _reply({"exited": pid})
    line = sys.stdin.readline()
    if not line:  # the launcher went away: end what the child left and leave
        _kill_group(pid)
        os.waitpid(pid, 0)
        return False
    _, status = os.waitpid(pid, 0)
    _reply({"returncode": os.waitstatus_to_exitcode(status)})
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Import, say ready, serve requests until the input ends."""
    modules = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    from budgettune.trial.cpu_cores import apply_cpu_share

    apply_cpu_share()  # its trials' share of the cores (their environment is its own)
    started = time.monotonic()
    # torch.cuda.is_available() asks the CUDA driver (cuInit) unless told to ask NVML, and a
    # process forked after cuInit cannot start CUDA; the compiler's imports call it. The
    # trials' own environment (which replaces this one in each child) is left as it is.
    os.environ[NVML_CHECK] = "1"
    failed = _preload([*COMPILER_MODULES, *modules])
    if "torch" in failed:
        _reply({"error": "torch could not be imported"})
        return 1
    touched = cuda_touched()
    if touched:
        _reply({"error": f"{touched} while importing: a forked trial could not use CUDA"})
        return 1
    _reply({"ready": True, "pid": os.getpid(), "imports_s": time.monotonic() - started})
    server_pid = os.getpid()
    for line in sys.stdin:
        request = json.loads(line)
        if not _serve_one(request, server_pid):
            break
    return 0


if __name__ == "__main__":
    # Nothing is left to write or close when main returns (every child was waited for, each
    # reply flushed): leave at once. The interpreter's own teardown of torch and its compiler
    # took 2.1 s on a 2-core host, and the launcher waits for it at the end of every search.
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
