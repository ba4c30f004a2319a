"""Workers: join a study and run its trials up to the target; one worker per GPU for ``--gpus``.

    run_worker(WorkerJob(study_name="tiny-gpt-cpu-125MB-device", storage_url=url))
    run_gpu_workers(searcher, [0, 1, 2, 3], search=search, storage_url=url, observer=observer)

(the second is `budgettune search --gpus 0,1,2,3`). A worker reads the whole `SearchSpec` from the
study (stored by the ``search`` that created it), so it needs only the study name and the storage.
Each worker runs one trial at a time on its device; ``--gpus`` starts one ``budgettune worker
--device cuda:N`` process per GPU, so no GPU ever runs two trials, or ``--trials-per-gpu`` of them
per GPU, which then take turns on it (`budgettune.trial.gpu_turns`: only their compiles overlap).
What counts toward the target: `budgettune.study.target`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import (
    DeviceUnavailableError,
    StudyNotFoundError,
    TrialInfrastructureError,
    UsageError,
    WorkerFailedError,
)
from budgettune.storage.coordination import database_errors
from budgettune.storage.unreadable import stored_object
from budgettune.storage.user_attrs import HEARTBEAT_ATTR, SPEC_ATTR
from budgettune.study.searcher import Searcher
from budgettune.study.spec import SearchSpec, check_study_name
from budgettune.study.study import (
    SAMPLER_STREAM_ENV,
    SearchObserver,
    sampler_stream,
    worker_sampler_seed,
)
from budgettune.study.target import HEARTBEAT_INTERVAL_S, NextStep, TrialCount
from budgettune.trial.cpu_cores import apply_cpu_share, cpu_shares, share_env
from budgettune.trial.devices import check_device_available, cuda_device_count
from budgettune.trial.phases import SEARCH_STARTED_ENV, process_started_at, startup_line
from budgettune.trial.processes import spawn
from budgettune.trial.trial_run import DEVICE_PATTERN
from budgettune.workload import check_reference

logger = logging.getLogger(__name__)

STORAGE_ENV = "BUDGETTUNE_STORAGE"
"""Environment variable `budgettune worker` reads the storage URL from (keeps passwords off
the process list)."""
PROGRESS_POLL_S = 1.0
STOP_GRACE_S = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerJob:
    """What one `budgettune worker` is asked to do."""

    study_name: str
    """The study to join; it must exist."""
    storage_url: str | None = None
    """SQLAlchemy URL or SQLite path; None is ``./budgettune.db``."""
    device: str | None = None
    """``cpu`` or ``cuda:N``; None: the device the study's search was made for."""
    max_trials: int | None = None
    """Run at most this many trials; None: until the study's target is met."""
    runs_dir: str | None = None
    """Where trial logs and compile caches go; None: the study's (relative to the cwd)."""
    heartbeat_interval_s: int | None = None
    """Optuna trial heartbeat; None: the study's (every process of a study beats alike)."""

    def __post_init__(self) -> None:
        check_study_name(self.study_name)  # it names the folder the trials write into
        if self.device is not None and not DEVICE_PATTERN.fullmatch(self.device):
            raise UsageError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.max_trials is not None and self.max_trials < 1:
            raise UsageError(f"--max-trials must be at least 1, got {self.max_trials}")
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s < 1:
            raise UsageError(f"--heartbeat-s must be at least 1, got {self.heartbeat_interval_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerOutcome:
    """What a worker did."""

    study_name: str
    """The study."""
    storage_url: str
    """Where it is stored (password masked)."""
    device: str
    """The device its trials ran on."""
    trials_run: int
    """Trials this worker ran."""
    finished: int
    """Counted trials of the study finished when it stopped."""
    target: int
    """The study's target."""


def run_worker(job: WorkerJob, observer: SearchObserver | None = None) -> WorkerOutcome:
    """Join ``job.study_name`` and run trials until its target is met.

    Args:
        job: the study, storage, device and limits.
        observer: receives progress (the CLI's progress bar).

    Returns:
        The `WorkerOutcome`.

    Raises:
        StudyNotFoundError: no such study (the message lists those that exist).
        UsageError: a device that is not here, a study made without a stored spec, a limit
            under the steady memory.
        StorageError: unreachable, schema ahead or behind, or lost mid-run (finished trials
            stay stored).
    """
    marks = {"started": process_started_at(), "imported": time.monotonic()}
    apply_cpu_share()  # its GPU's share of the cores, from `run_gpu_workers`
    if job.device is not None:
        check_device_available(job.device)
    store = storage_mod.open_storage(
        job.storage_url,
        create=False,
        heartbeat_interval_s=job.heartbeat_interval_s or HEARTBEAT_INTERVAL_S,
    )
    with database_errors(store.url):
        names = store.study_names()
        if job.study_name not in names:
            raise StudyNotFoundError(
                f"no study {job.study_name!r} in {store.display_url}; studies: "
                f"{', '.join(names) if names else 'none'}; create it with `budgettune search "
                f"--study-name {job.study_name} --storage-url URL ...`"
            )
        attrs = optuna.load_study(
            study_name=job.study_name, storage=store.optuna_storage
        ).user_attrs
    heartbeat_s = int(attrs.get(HEARTBEAT_ATTR, HEARTBEAT_INTERVAL_S))
    if job.heartbeat_interval_s is not None and job.heartbeat_interval_s != heartbeat_s:
        raise UsageError(
            f"study {job.study_name!r} uses a trial heartbeat of {heartbeat_s} s, set when it "
            f"was created; every worker of a study must beat alike (a faster stale-trial check "
            f"fails slower workers' live trials): drop --heartbeat-s {job.heartbeat_interval_s}"
        )
    # The running trial beats, and stale trials are judged, at the study's interval.
    store.optuna_storage.heartbeat_interval = heartbeat_s
    stored = stored_object(attrs, SPEC_ATTR) or None  # a hand-edited `[5]`: none (P9-1)
    if stored is None:
        raise UsageError(
            f"study {job.study_name!r} holds no search spec for workers (made by an older "
            f"budgettune); run `budgettune search --study-name {job.study_name} ...` once to "
            "add it"
        )
    overrides: dict[str, object] = {
        "storage_url": store.url,
        "num_trials": job.max_trials or 1,
        "sampler_seed": worker_sampler_seed(stored.get("sampler_seed"), sampler_stream()),
    }
    if job.device is not None:
        overrides["device"] = job.device
    if job.runs_dir is not None:
        overrides["runs_dir"] = job.runs_dir
    search = SearchSpec.from_json_dict(stored, **overrides)
    check_reference(search.workload, search.workload_options)
    check_device_available(search.device)
    with Searcher(search, store, observer, add_trials=False) as searcher:
        with database_errors(store.url):
            start = searcher.count()
        said = startup_line(f"worker on {search.device}", {**marks, "ready": time.monotonic()})
        if said:
            print(said, file=sys.stderr, flush=True)
        searcher.observer.started(job.study_name, max(start.target - start.finished, 0))
        searcher.run_trials(max_trials=job.max_trials)
        with database_errors(store.url):
            end = searcher.count()
    return WorkerOutcome(
        study_name=job.study_name,
        storage_url=store.display_url,
        device=search.device,
        trials_run=searcher.done,
        finished=end.finished,
        target=end.target,
    )


def check_gpus(gpus: Sequence[int]) -> None:
    """Fail early when ``--gpus`` names a GPU twice or one this machine does not have.

    Raises:
        UsageError: a repeated or negative index.
        DeviceUnavailableError: no GPU at all, or an index past the last one.
    """
    shown = ",".join(str(g) for g in gpus)
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise UsageError(f"--gpus {shown}: list each GPU index once (one worker per GPU)")
    if cuda_device_count() == 0:
        raise DeviceUnavailableError(
            f"--gpus {shown}: no CUDA GPU on this machine (NVML sees none); run without "
            "--gpus, or start `budgettune worker --device cpu` processes"
        )
    for gpu in gpus:
        check_device_available(f"cuda:{gpu}")


def gpu_groups(gpus: Sequence[int], nproc_per_node: int) -> list[tuple[int, ...]]:
    """``--gpus 0,1,2,3 --nproc-per-node 2`` → [(0, 1), (2, 3)]: one worker per group.

    Raises:
        UsageError: a negative or repeated index, fewer than 1 rank, or GPUs that do not split
            into groups of ``nproc_per_node``.
    """
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(
            f"--gpus {','.join(map(str, gpus))}: list distinct GPU indices from 0, e.g. 0,1,2,3"
        )
    if len(gpus) % nproc_per_node:
        raise UsageError(
            f"--gpus {','.join(map(str, gpus))}: {len(gpus)} GPU(s) do not split into groups "
            f"of --nproc-per-node {nproc_per_node} (one group per sharded trial)"
        )
    return [
        tuple(gpus[start : start + nproc_per_node])
        for start in range(0, len(gpus), nproc_per_node)
    ]


def group_device(group: Sequence[int]) -> str:
    """The device string of a GPU group: ``cuda:2`` or ``cuda:2,3``."""
    return "cuda:" + ",".join(str(g) for g in group)


def worker_command(
    *, study_name: str, gpu: int | Sequence[int], runs_dir: str | Path
) -> list[str]:
    """The command of the worker process for one GPU or GPU group (the storage URL goes in
    `STORAGE_ENV`).

    ``--device cuda:N`` (``cuda:N,M`` for a sharded trial's group) makes the launcher pin each
    trial to those GPUs alone (``CUDA_VISIBLE_DEVICES``); the worker runs one trial at a time.
    """
    group = (gpu,) if isinstance(gpu, int) else tuple(gpu)
    return [
        sys.executable, "-m", "budgettune.cli", "worker",
        "--study", study_name,
        "--device", group_device(group),
        "--runs-dir", str(runs_dir),
    ]  # fmt: skip


class StudyWatch(Protocol):
    """What `run_gpu_workers` reads of the study while its workers run (a `Searcher`)."""

    def count(self) -> TrialCount:
        """The study against its target."""
        ...

    def best_feasible_ms(self) -> float | None:
        """The fastest feasible step time so far."""
        ...


def run_gpu_workers(
    study: StudyWatch,
    gpus: Sequence[int],
    *,
    search: SearchSpec,
    storage_url: str,
    observer: SearchObserver,
    on_poll: Callable[[TrialCount], None] | None = None,
) -> int:
    """Run one worker process per GPU (per group of ``nproc_per_node`` GPUs for sharded
    trials) until the study's target is met and none of its trials runs (workers still
    exiting are reaped by a thread: issue 44, they took 4-6 s before the re-verification).

    Their output goes to ``<runs_dir>/<study>/workers/cuda<N>.log`` (``cuda<N>_<M>.log``).

    Args:
        study: the study's progress, read while the workers run.
        gpus: the GPU indices.
        search: the search the workers join (its study name, runs folder and ranks).
        storage_url: the study's storage, handed to the workers in `STORAGE_ENV`.
        observer: told how many trials finished.
        on_poll: called with the study's count after each poll, in this thread
            (`early_round.EarlyRound.poll`: the fresh runs' servers, the early runs).

    Returns:
        Trials finished while they ran.

    Raises:
        WorkerFailedError: workers exited with an error before the target was met.
        TrialInfrastructureError: the workers' log folder cannot be made.
        KeyboardInterrupt: after each worker was interrupted (its trial queued again).
    """
    with database_errors(storage_url):
        start = study.count()
    runs_dir = Path(search.runs_dir).resolve()
    log_dir = runs_dir / search.study_name / "workers"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrialInfrastructureError(
            f"cannot make the workers' log folder {log_dir} ({exc.strerror}); check --runs-dir "
            "and the free space on its disk"
        ) from exc
    env = {**os.environ, STORAGE_ENV: storage_url, SEARCH_STARTED_ENV: str(process_started_at())}
    groups = gpu_groups(gpus, search.nproc_per_node)
    shares = cpu_shares([group_device(group) for group in groups])
    workers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        for group in groups:
            for turn in range(search.trials_per_gpu):  # they take turns on their GPU
                suffix = f"-{turn + 1}" if turn else ""
                log_path = log_dir / f"cuda{'_'.join(map(str, group))}{suffix}.log"
                own = {**env, SAMPLER_STREAM_ENV: str(len(workers) + 1)}
                own.update(share_env(shares.get(group_device(group)), search.trials_per_gpu))
                workers.append(_start_worker(search, group, runs_dir, own, log_path))
        while any(process.poll() is None for _, process, _ in workers):
            time.sleep(PROGRESS_POLL_S)
            with database_errors(storage_url):
                now = study.count()
                observer.trials_finished(now.finished - start.finished, study.best_feasible_ms())
            if on_poll is not None:
                on_poll(now)
            if now.next_step() is NextStep.STOP:
                break
    except BaseException:
        _stop(workers)
        raise
    for _, process, _ in workers:  # those past the target still exiting: reaped by a thread
        if process.poll() is None:
            threading.Thread(target=process.wait, daemon=True).start()
    with database_errors(storage_url):
        end = study.count()
    observer.trials_finished(end.finished - start.finished, study.best_feasible_ms())
    failed = [
        (gpu, process.returncode, log) for gpu, process, log in workers if process.returncode
    ]
    if failed and end.finished < end.target:
        gpu, code, log = failed[0]
        raise WorkerFailedError(
            f"worker on {gpu} exited with code {code}: {_last_line(log)} (log: {log}); "
            f"{end.finished}/{end.target} trials finished and kept; fix it and run "
            "the search again"
        )
    for gpu, code, log in failed:
        logger.warning("worker on %s exited with code %d (log: %s)", gpu, code, log)
    return end.finished - start.finished


def _start_worker(
    search: SearchSpec,
    group: tuple[int, ...],
    runs_dir: Path,
    env: dict[str, str],
    log_path: Path,
) -> tuple[str, subprocess.Popen[bytes], Path]:
    """One worker process on a GPU group, its output to ``log_path``."""
    with open(log_path, "ab") as log_file:
        process = spawn(
            worker_command(study_name=search.study_name, gpu=group, runs_dir=runs_dir),
            output=log_file,
            env=env,
        )
    return group_device(group), process, log_path


def _stop(workers: list[tuple[str, subprocess.Popen[bytes], Path]]) -> None:
    """Interrupt every worker (each queues its running trial again), then wait, then kill."""
    for _, process, _ in workers:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for _, process, _ in workers:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    lines = [line for line in lines if line]
    return lines[-1] if lines else "(empty log)"
