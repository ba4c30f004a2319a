"""The launcher's side of the trial servers (`budgettune.trial.forkserver`): a pool of
pre-imported servers by environment, and the child a server forks, handled like a spawned one.

A trial process takes its environment at the start: torch reads most of its settings when it
is imported. A server is started with the environment its children will have, less what torch
reads only later (`LATE_ENV`), and a trial goes to a server whose environment is its own in
everything else; there is one server per such environment (and per device: the device is in
the environment), each serving one trial at a time. Servers are started by one long-lived
thread of the pool, so that they die with the process that owns the pool (Linux's parent-death
signal follows the thread that started a child, and a batch's threads come and go), and they
are stopped by `TrialServers.close`.

A pool that cannot serve (a server that does not start, a child that finds CUDA unusable in
its fork) says why once in the log and returns None: the launcher then starts the trial as a
fresh process, as it always did.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Protocol

from budgettune.trial.phases import LAUNCHED_AT_ENV
from budgettune.trial.processes import die_with_parent, end_session, wait_unreaped

logger = logging.getLogger(__name__)

LATE_ENV = frozenset(
    {
        LAUNCHED_AT_ENV,
        "TORCHINDUCTOR_CACHE_DIR",  # read on use (torch._inductor.runtime.cache_dir_utils)
        "TRITON_CACHE_DIR",  # read on use
        "PYTORCH_CUDA_ALLOC_CONF",  # applied by the child's setter before CUDA allocates
    }
)
"""Variables a served trial may have that its server was not started with."""
REPLY_TIMEOUT_S = 60.0
"""How long a server may take to answer a request (fork, reap)."""


class ChildProcess(Protocol):
    """A trial child as the launcher handles it, spawned or forked by a server."""

    @property
    def pid(self) -> int:
        """Its process id (and process group: each trial child leads its own session)."""
        ...

    def wait_unreaped(self, timeout_s: float | None) -> bool:
        """Wait until it exits (True) or ``timeout_s`` passes (False); it stays unreaped."""
        ...

    def end_session(self, timeout_s: float | None = None) -> int | None:
        """Kill what is left of its process group, reap it; its return code (None: not
        reaped within ``timeout_s``)."""
        ...


class SpawnedChild:
    """A child the launcher started itself (`budgettune.trial.processes.spawn`)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_unreaped(self, timeout_s: float | None) -> bool:
        return wait_unreaped(self.process, timeout_s)

    def end_session(self, timeout_s: float | None = None) -> int | None:
        return end_session(self.process, timeout_s)


class ServerGone(Exception):
    """The server exited or stopped answering."""


class _Server:
    """One running server and its two pipes."""

    def __init__(self, process: subprocess.Popen[bytes], key: frozenset[tuple[str, str]]) -> None:
        self.process = process
        self.key = key
        self.ready = False
        self._buffer = b""

    def poll_ready(self, timeout_s: float) -> bool:
        """Whether it has said it is ready (waiting up to ``timeout_s`` for it to say so).

        Raises:
            ServerGone: it exited, or said it cannot serve (its reason is the message).
        """
        if self.ready:
            return True
        message = self.receive(timeout_s)
        if message is None:
            return False
        if not message.get("ready"):
            raise ServerGone(str(message.get("error", message)))
        self.ready = True
        pid, imports_s = self.process.pid, message.get("imports_s", 0.0)
        logger.info("trial server %s ready (imports %.1f s)", pid, imports_s)
        return True

    def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise ServerGone(f"trial server {self.process.pid} went away") from exc

    def receive(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next message; None when ``timeout_s`` passes first.

        Raises:
            ServerGone: its output ended (it exited).
        """
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ServerGone(f"trial server {self.process.pid} exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ServerGone(f"trial server {self.process.pid} said {message!r}")
        return message

    def expect(self, key: str, timeout_s: float = REPLY_TIMEOUT_S) -> Any:
        message = self.receive(timeout_s)
        if message is None or key not in message:
            raise ServerGone(f"trial server {self.process.pid} answered {message!r}, not {key}")
        return message[key]

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ServedChild:
    """A trial child a server forked: waited for and ended through the server."""

    def __init__(self, server: _Server, pid: int, release: Callable[[_Server, bool], None]):
        self.server = server
        self._pid = pid
        self._release = release
        self._exited = False
        self.returncode: int | None = None
        self.lost = ""
        """Why the child's end is not known (its server died or said something else)."""

    @property
    def pid(self) -> int:
        return self._pid

    def wait_unreaped(self, timeout_s: float | None) -> bool:
        if self._exited:
            return True
        try:
            message = self.server.receive(timeout_s)
        except ServerGone as exc:
            self.lost = str(exc)  # its child was killed with it (parent-death signal)
            self._exited = True
            return True
        if message is None:
            return False
        if "exited" not in message:
            self.lost = f"trial server {self.server.process.pid} said {message!r}"
        self._exited = True
        return True

    def end_session(self, timeout_s: float | None = None) -> int | None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pid, signal.SIGKILL)  # not reaped yet: the group id is its own
        try:
            if not self._exited:
                self.wait_unreaped(30.0 if timeout_s is None else timeout_s)
            if self._exited and not self.lost:
                self.server.send({"reap": self._pid})
                self.returncode = int(self.server.expect("returncode"))
            elif not self._exited:
                self.lost = f"trial server {self.server.process.pid} did not reap its child"
        except ServerGone as exc:
            self.lost = str(exc)
        self._release(self.server, not self.lost)
        return self.returncode


class TrialServers:
    """Trial servers of one process (a search, a worker, a verify), by environment."""

    def __init__(
        self,
        *,
        preload: Sequence[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
        ready_wait_s: float = 0.0,
    ) -> None:
        """A pool with no server yet.

        Args:
            preload: modules the servers import besides torch's compiler
                (`budgettune.workload.preload_modules`).
            log_dir: where each server's own output goes (``server-N.log``); None: nowhere.
            ready_wait_s: how long a trial waits for a server that is still importing
                (0: it starts as a new process instead, and a later trial takes the server).
        """
        self.preload = tuple(preload)
        self.ready_wait_s = ready_wait_s
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.disabled = ""
        """Why the pool serves no more trials (empty: it does)."""
        self._lock = threading.Lock()
        self._idle: dict[frozenset[tuple[str, str]], list[_Server | Future[_Server]]] = {}
        self._all: list[_Server] = []
        self._starts: queue.Queue[tuple[dict[str, str], Future[_Server]] | None] = queue.Queue()
        self._starter = threading.Thread(target=self._start_servers, daemon=True)
        self._starter.start()

    # -- the starter thread ------------------------------------------------------------------
    def _start_servers(self) -> None:
        while (item := self._starts.get()) is not None:
            env, future = item
            try:
                future.set_result(self._start(env))
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(exc)

    def _start(self, env: dict[str, str]) -> _Server:
        log: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_dir / f"server-{len(self._all)}.log", "ab")  # noqa: SIM115
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "budgettune.trial.forkserver", *self.preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**env, "PYTHONUNBUFFERED": "1"},
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        server = _Server(process, _key(env))
        with self._lock:
            self._all.append(server)
        return server

    # -- taking and giving back --------------------------------------------------------------
    def _request_start(self, env: Mapping[str, str]) -> Future[_Server]:
        future: Future[_Server] = Future()
        self._starts.put(({k: v for k, v in env.items() if k not in LATE_ENV}, future))
        return future

    def _take(self, env: Mapping[str, str]) -> _Server | None:
        """An idle ready server for ``env``: one is started when there is none, and a trial
        that finds none ready within ``ready_wait_s`` gets None (it starts a new process)."""
        key = _key(env)
        with self._lock:
            if self.disabled:
                return None
            waiting = self._idle.setdefault(key, [])
            waiting[:] = [_started(e) for e in waiting]
            ready = [e for e in waiting if isinstance(e, _Server) and _ready_now(e)]
            entry = ready[-1] if ready else waiting[-1] if waiting else None
            if entry is None:
                entry = self._request_start(env)
            else:
                waiting.remove(entry)
        server: _Server | None = None
        try:
            server = entry if isinstance(entry, _Server) else entry.result(self.ready_wait_s)
            if server.poll_ready(self.ready_wait_s):
                return server
            entry = server
        except FutureTimeout:
            pass
        except (ServerGone, OSError) as exc:
            if server is not None:
                server.stop()
            self.disable(f"a trial server did not start: {exc}")
            return None
        with self._lock:  # still importing: a later trial takes it
            self._idle.setdefault(key, []).append(entry)
        return None

    def prestart(self, envs: Sequence[Mapping[str, str]]) -> None:
        """Start one server for each of ``envs`` (an environment twice: two servers) now,
        so that trials that will come at once (a batch of fresh runs over every slot of a
        search) each find one ready (issue 44: 6-7 s of imports each, on four GPUs)."""
        with self._lock:
            if self.disabled:
                return
            for env in envs:
                future = self._request_start(env)
                self._idle.setdefault(_key(env), []).append(future)

    def _release(self, server: _Server, healthy: bool) -> None:
        with self._lock:
            if healthy and not self.disabled and server.process.poll() is None:
                self._idle.setdefault(server.key, []).append(server)
                return
        server.stop()

    def start_child(
        self, *, spec_path: Path, result_path: Path, log_path: Path, env: Mapping[str, str]
    ) -> ServedChild | None:
        """Fork a trial child with ``env`` from a server of that environment (started if
        there is none idle); None when the pool cannot serve it (the caller spawns one)."""
        server = self._take(env)
        if server is None:
            return None
        request = {
            "spec": str(spec_path),
            "result": str(result_path),
            "log": str(log_path),
            "env": dict(env),
        }
        try:
            server.send(request)
            pid = int(server.expect("pid"))
        except ServerGone as exc:
            logger.warning("trial server failed: %s; starting the trial as a new process", exc)
            self._release(server, False)
            return None
        return ServedChild(server, pid, self._release)

    def disable(self, reason: str) -> None:
        """Serve no more trials (each is started as a fresh process from now on)."""
        with self._lock:
            if not self.disabled:
                self.disabled = reason
                logger.warning("%s; trials start as new processes", reason)

    def close(self) -> None:
        """Stop every server (their children have ended: each was waited for)."""
        self._starts.put(None)
        self._starter.join(timeout=10)
        with self._lock:
            servers, self._all = list(self._all), []
            self._idle.clear()
        for server in servers:
            server.stop()

    def __enter__(self) -> TrialServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _started(entry: _Server | Future[_Server]) -> _Server | Future[_Server]:
    """A server whose start has finished, as the server; else the entry as it is."""
    if isinstance(entry, Future) and entry.done() and entry.exception() is None:
        return entry.result()
    return entry


def _ready_now(server: _Server) -> bool:
    """Whether ``server`` has said it is ready, without waiting (one that exited is not)."""
    try:
        return server.poll_ready(0.0)
    except ServerGone:
        return False


def _key(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in env.items() if k not in LATE_ENV)
