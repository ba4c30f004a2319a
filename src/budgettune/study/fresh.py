"""Fresh re-measurements (re-verification, the references a pin is compared with), spread over
every device the search was given.

Each run is a fresh child process like a trial. With ``--gpus 0,1,...`` the runs of a batch go
to every listed GPU at once, one run per GPU at a time (the rule trials follow), instead of all
to the first one (benchmarks/results/README.md#fresh-runs-on-every-gpu). On one device (or the
CPU) they run one after another. Each result is handed to the caller's ``finish`` (numerics
check, storage write) in the calling thread, in the order the runs were asked for, as soon as it
and the ones before it are in: a search cut off mid-way keeps the runs it finished, and the next
one reuses them (`Searcher.fresh_batch`).
"""

from __future__ import annotations

import dataclasses
import queue
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from budgettune.storage import Storage
from budgettune.trial.cpu_cores import share_env
from budgettune.trial.launcher import launch_trial, run_env
from budgettune.trial.results import TrialResult
from budgettune.trial.servers import TrialServers
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun
from budgettune.units import format_count


@dataclass(frozen=True, kw_only=True, slots=True)
class FreshJob:
    """One configuration to re-measure ``runs`` times, stored against trial ``number``."""

    spec: TrialSpec
    """The configuration."""
    number: int
    """The trial the runs are stored against (kind ``reverify``)."""
    run_name: str
    """Run folders are ``<runs_dir>/<run_name>-<repeat>``."""
    phase: str
    """What the progress display says while it runs."""
    check: bool = True
    """Compare each run's numerics with the study's reference."""
    cold: bool = False
    """Its first run is a new process on a GPU (never forked from a trial server: `launcher`)
    with empty compile caches of its own, Triton's included, as a job on a fresh host (its
    later runs share the study's caches and may fork). Issue 44: with the study's Triton
    cache kept, one such run of a pinned configuration compiled a program 0.8 GB lighter and
    8 % slower than the same configuration's other runs, and the pin understated its cold
    job's peak by 0.9 % (benchmarks/results/h200-compile-threads-2026-11-29/); forked from a
    server with caches of its own, a low-budget point's cold run compiled that lighter program
    in two searches where five new processes all compiled the job's heavier one
    (benchmarks/results/h200-probe-2026-11-29/)."""


COLD_CACHES = "cold-caches"
"""A cold run's own compile caches, in its run folder while it runs (deleted after)."""

Launch = Callable[[TrialRun, Path], TrialResult]
"""Runs one fresh measurement (``launch_trial`` with the search's timeout)."""


def run_batch(
    jobs: Sequence[FreshJob],
    *,
    runs: int | Sequence[int],
    make_run: Callable[[TrialSpec], TrialRun],
    runs_dir: Path,
    devices: Sequence[str],
    launch: Launch,
    on_phase: Callable[[str], None],
    finish: Callable[[int, TrialResult], TrialResult] | None = None,
    first_repeat: Sequence[int] | None = None,
) -> list[list[TrialResult]]:
    """Measure every job ``runs`` times; with several devices, the runs go out in parallel.

    Args:
        jobs: the configurations, in the order their results are returned.
        runs: fresh runs per job (one count for all, or one per job; 0 runs none).
        make_run: the `TrialRun` of a spec for this search (its device is replaced by the
            slot's when ``devices`` has more than one entry).
        runs_dir: the study's run folder.
        devices: the device slots (``cuda:0``, ``cuda:1``, ...); one run per slot at a time.
        launch: measures one run in a fresh process.
        on_phase: progress.
        finish: called with (job index, result) for every run, in the calling thread and in
            task order, as soon as the run and those asked for before it have finished; what
            it returns is kept (a numerics check may change the outcome).
        first_repeat: per job, the number of its first run folder (runs already made elsewhere
            keep theirs); default 0.

    Returns:
        Each job's results, in run order.
    """
    counts = [runs] * len(jobs) if isinstance(runs, int) else list(runs)
    offsets = list(first_repeat) if first_repeat is not None else [0] * len(jobs)
    tasks = [(index, repeat) for index in range(len(jobs)) for repeat in range(counts[index])]
    results: list[list[TrialResult | None]] = [[None] * n for n in counts]

    def keep(index: int, repeat: int, result: TrialResult) -> None:
        results[index][repeat] = result if finish is None else finish(index, result)

    def prepared(index: int, repeat: int, device: str | None) -> tuple[TrialRun, Path]:
        run = make_run(jobs[index].spec)
        if device is not None:
            run = dataclasses.replace(run, device=device)
        folder = runs_dir / f"{jobs[index].run_name}-{offsets[index] + repeat}"
        if jobs[index].cold and repeat == 0 and run.cache_root is not None:
            run = dataclasses.replace(run, cache_root=str(folder / COLD_CACHES))
        return run, folder

    def measured(index: int, repeat: int, device: str | None) -> TrialResult:
        run, folder = prepared(index, repeat, device)
        try:
            return launch(run, folder)
        finally:
            if run.cache_root is not None and run.cache_root.endswith(COLD_CACHES):
                shutil.rmtree(run.cache_root, ignore_errors=True)  # compiled code, no record

    if len(devices) <= 1:
        for index, repeat in tasks:
            on_phase(f"{jobs[index].phase} ({repeat + 1}/{counts[index]})")
            keep(index, repeat, measured(index, repeat, None))
        return [[r for r in rs if r is not None] for rs in results]

    free: queue.Queue[str] = queue.Queue()
    for device in devices:
        free.put(device)

    def one(index: int, repeat: int) -> TrialResult:
        device = free.get()
        try:
            return measured(index, repeat, device)
        finally:
            free.put(device)

    names = ", ".join(dict.fromkeys(job.phase for job in jobs))
    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        futures: dict[tuple[int, int], Future[TrialResult]] = {
            task: pool.submit(one, *task) for task in tasks
        }
        for done, (index, repeat) in enumerate(tasks, start=1):
            on_phase(f"{names}: {_runs_on(len(tasks), devices)} ({done}/{len(tasks)})")
            keep(index, repeat, futures[(index, repeat)].result())
    return [[r for r in rs if r is not None] for rs in results]


def _runs_on(runs: int, devices: Sequence[str]) -> str:
    """The progress words for ``runs`` runs ("1 run on 4 slots of 1 device", "6 runs on 2
    devices"): ``devices`` names a device once a slot (`Searcher.devices`)."""
    held = format_count(len(set(devices)), "device")
    where = held if len(devices) == len(set(devices)) else f"{len(devices)} slots of {held}"
    return f"{format_count(runs, 'run')} on {where}"


def cold_once(jobs: Sequence[FreshJob], kept: Sequence[Sequence[TrialResult]]) -> list[FreshJob]:
    """The jobs, each asking for a cold run only if none of its runs ``kept`` was one."""
    return [
        dataclasses.replace(job, cold=job.cold and not any(r.cold_caches for r in old))
        for job, old in zip(jobs, kept, strict=True)
    ]


def launcher(
    timeout_s: float,
    servers: TrialServers | None = None,
    cpu_shares: Mapping[str, str] | None = None,
    sharing: int = 1,
) -> Launch:
    """`launch_trial` with the search's timeout and trial servers (a cold run on a GPU, in
    caches of its own, starts as a new process: `FreshJob.cold`); a run on a device that
    ``cpu_shares`` names keeps to that share of the cores, and ``sharing`` runs a GPU split
    its compile workers (`budgettune.trial.cpu_cores.share_env`).

    On a CPU a cold run still forks: the two programs were seen on GPUs only (a fork and a new
    process compiled one program on CPU: benchmarks/results/cpu-fork-program-2026-11-29.txt),
    and a new process made the CPU demo's search 18 % slower (its one cold run)."""

    def launch(run: TrialRun, run_dir: Path) -> TrialResult:
        extra = share_env((cpu_shares or {}).get(run.device), sharing)
        cold = (
            run.is_cuda and run.cache_root is not None and Path(run.cache_root).name == COLD_CACHES
        )
        return launch_trial(
            run,
            run_dir=run_dir,
            timeout_s=timeout_s,
            servers=None if cold else servers,
            extra_env=extra or None,
        )

    return launch


def stored_runs(
    store: Storage, study_name: str, jobs: Sequence[FreshJob]
) -> list[list[TrialResult]]:
    """Per job, the ``reverify`` runs the study already holds that count for it (a search cut
    off while re-verifying, resumed): same trial, same configuration, and measured on the GPU
    model and torch version of the trial's own measurement (when it has none, nothing counts).
    The study's measurements are read once for the whole batch."""
    reverified = store.measurements(study_name, kind="reverify")
    if not reverified:
        return [[] for _ in jobs]
    machine = {
        m.trial_number: (m.device_name, m.torch_version)  # the last measurement of each trial
        for m in store.measurements(study_name, kind="trial")
    }
    return [
        [
            m.to_result()
            for m in reverified
            if m.trial_number == job.number
            and m.spec == job.spec
            and (m.device_name, m.torch_version) == machine.get(job.number)
        ]
        for job in jobs
    ]


def prestart_servers(
    servers: TrialServers | None,
    make_run: Callable[[TrialSpec], TrialRun],
    base: TrialSpec,
    devices: Sequence[str],
    cpu_shares: Mapping[str, str],
    sharing: int = 1,
) -> None:
    """Start a trial server for each device slot of the fresh runs now, so that the first
    batch of re-verification forks from servers that have imported torch and the workload's
    modules (issue 44: the trials ran in workers, whose servers the search's own process does
    not share, and each of a 4-GPU search's 15 fresh runs spent 6-7 s importing them).
    Nothing on one device slot (its runs go one at a time) or without servers (sharded)."""
    if servers is None or len(devices) <= 1:
        return
    run = make_run(base)
    envs = []
    for device in devices:
        extra = share_env(cpu_shares.get(device), sharing) or None
        envs.append(run_env(dataclasses.replace(run, device=device), extra))
    servers.prestart(envs)
