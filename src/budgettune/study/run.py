"""`run_search`: one `budgettune search` from start to pin, in this process or by GPU workers."""

from __future__ import annotations

from collections.abc import Sequence

from budgettune import storage as storage_mod
from budgettune.errors import UsageError, shown_path
from budgettune.storage.coordination import creation_lock, database_errors
from budgettune.storage.engine import storage_files
from budgettune.study.early_round import EarlyRound
from budgettune.study.fresh import prestart_servers
from budgettune.study.searcher import Searcher
from budgettune.study.spec import SearchSpec
from budgettune.study.study import SearchObserver, SearchOutcome
from budgettune.study.target import HEARTBEAT_INTERVAL_S
from budgettune.study.workers import check_gpus, gpu_groups, group_device, run_gpu_workers
from budgettune.trial.devices import check_device_available, device_indices
from budgettune.trial.launcher import check_ops_exist
from budgettune.workload import check_reference


def run_search(
    search: SearchSpec, observer: SearchObserver | None = None, *, gpus: Sequence[int] = ()
) -> SearchOutcome:
    """Raise the study's target by ``search.num_trials``, run trials to it, re-verify, pin.

    Args:
        search: the whole search.
        observer: receives progress (the CLI's progress bar).
        gpus: run one worker process per GPU index on this host (``--gpus 0,1``), or per
            group of ``search.nproc_per_node`` GPUs, instead of trials in this process;
            re-verification then runs on ``search.device``.

    Returns:
        The `SearchOutcome` with the pinned config document.

    Raises:
        UsageError: bad input (reference, device, a limit under the steady memory).
        StorageError: the storage cannot be used (unreachable, schema behind or ahead, lost).
        NoFeasibleConfigError: nothing measured fits under the limit.
        NothingMeasuredError: no trial could be measured at all.
        TrialInfrastructureError: a trial's run folder or disk failed (the trial is queued
            again; nothing is excluded).
        WorkerFailedError: with ``gpus``, workers exited before the target was met.
        KeyboardInterrupt: after the running trial is failed and queued again (`Terminated`
            for SIGTERM); finished ones are kept.
    """
    check_reference(search.workload, search.workload_options)
    database = next(iter(storage_files(search.storage_url)), None)
    if search.num_trials == 0 and database is not None and not database.exists():
        # refused before the storage is opened, which would make an empty database (issue 48)
        raise UsageError(
            f"--num-trials 0 re-verifies and pins an existing study, and "
            f"{shown_path(str(database))} does not "
            "exist; give --num-trials N to start a study"
        )
    if gpus:
        check_gpus(gpus)
        gpu_groups(gpus, search.nproc_per_node)
    check_device_available(search.device)
    check_ops_exist(
        search.space.removable_ops + search.space.addable_ops,
        compiled_offload=search.compiled_offload_searched,
    )
    with creation_lock(search.storage_url):
        store = storage_mod.open_storage(
            search.storage_url, heartbeat_interval_s=HEARTBEAT_INTERVAL_S
        )
    if search.shares_gpus and not gpus:  # its trials share the one GPU: a worker each
        gpus = [device_indices(search.device)[0]]
    # re-measurements spread over the same device slots as the workers: one GPU, or one
    # group of --nproc-per-node GPUs, per fresh run (each GPU --trials-per-gpu times)
    groups = gpu_groups(gpus, search.nproc_per_node)
    devices = [group_device(group) for _ in range(search.trials_per_gpu) for group in groups]
    with Searcher(search, store, observer, devices=devices) as searcher:
        if search.num_trials == 0:
            # only re-verify and pin: no trial here, no worker, not even one re-queued from a
            # process that died, and the study's target as it was (other workers may be on it)
            searcher.observer.started(search.study_name, 0)
            trials_run = 0
        elif gpus:
            searcher.observer.started(search.study_name, search.num_trials)
            early = EarlyRound(
                searcher,
                on_first_finished=lambda: prestart_servers(
                    searcher.servers,
                    search.trial_run,
                    search.base,
                    searcher.devices,
                    searcher.cpu_shares,
                    search.trials_per_gpu,
                ),
            )
            trials_run = run_gpu_workers(
                searcher,
                gpus,
                search=search,
                storage_url=store.url,
                observer=searcher.observer,
                on_poll=early.poll,
            )
            early.finish()  # the first round's runs started early, stored for it to count
        else:
            searcher.observer.started(search.study_name, search.num_trials)
            searcher.run_trials()
            trials_run = searcher.done
        with database_errors(store.url):
            pin = searcher.pin()
        searcher.publish()
    return SearchOutcome(
        study_name=search.study_name,
        storage_url=store.display_url,
        trials_run=trials_run,
        pin=pin,
    )
