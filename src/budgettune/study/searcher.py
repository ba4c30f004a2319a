"""The study: create or resume, baselines first, ask → launch → tell, then re-verify and pin.

Optuna minimises the median step time with the constraint ``peak × (1 + margin) − limit ≤ 0``
on the chosen memory metric (its constraint support, not a penalty): the same "fits" as the
pin's, so the sampler is not rewarded for configurations the pin would refuse. A trial that
does not fit (over the limit, OOM, numerics mismatch, a non-finite loss) is PRUNED with its
constraint stored (and its step time, if it has one, as its one intermediate value), so the
sampler learns the boundary and Optuna's own "best trial" is the fastest that fits; crashes
and timeouts are failed trials with the reason in user attrs. Every measurement also lands in
our ``bt_measurements``. A trial that did not end through no fault of its configuration (an
interrupt, its run folder or disk failing) is failed and queued again (as Optuna's stale-trial
retry does): it excludes nothing. It never prints: progress goes to a callback the CLI renders.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import (
    BudgettuneError,
    TrialInfrastructureError,
    WorkloadFailedError,
)
from budgettune.pinning import measured_violation_bytes
from budgettune.storage.coordination import ClaimLock, database_errors
from budgettune.storage.trials import (
    BASELINE_ATTR,
    UNCONSTRAINED,
    best_feasible_ms,
    unconstrained_baseline,
)
from budgettune.storage.user_attrs import (
    CONSTRAINT_ATTR,
    ENQUEUED_SPEC_ATTR,
    ERROR_ATTR,
    WORKER_ATTR,
    TrialRecord,
    result_attrs,
)
from budgettune.study import live_searches
from budgettune.study.crash_memory import remember_crashes
from budgettune.study.expressible import suggest_for_target
from budgettune.study.fresh import FreshJob, cold_once, launcher, run_batch, stored_runs
from budgettune.study.numerics import check_numerics, reference_at
from budgettune.study.opening import (
    open_study,
    requeue_unfinished,
    retry_high_budget,
    stored_trial,
)
from budgettune.study.opening_plan import plan_opening, sampling_space
from budgettune.study.pin import pin_study
from budgettune.study.publish import refresh_views
from budgettune.study.space import suggest_spec
from budgettune.study.spec import SearchSpec
from budgettune.study.steady import check_steady, steady_error
from budgettune.study.study import (
    HIGH_BUDGET,
    SearchObserver,
    TrialEvent,
    TrialFailed,
)
from budgettune.study.target import HEARTBEAT_INTERVAL_S, NextStep, TrialCount, study_count
from budgettune.trial.cpu_cores import cpu_shares
from budgettune.trial.launcher import launch_trial, trial_servers
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

logger = logging.getLogger(__name__)

WAIT_POLL_S = 2.0
"""How often a worker with nothing to start looks again while others' trials run."""


class Searcher:
    """One invocation of a search over an opened storage (kept small: see `run_search`)."""

    def __init__(
        self,
        search: SearchSpec,
        store: storage_mod.Storage,
        observer: SearchObserver | None = None,
        *,
        devices: Sequence[str] = (),
        add_trials: bool = True,
    ) -> None:
        """Open the study.

        Args:
            search, store, observer: the whole search, the open storage, who hears progress.
            devices: the device slots re-measurements spread over (``cuda:N``, or
                ``cuda:N,M`` for a sharded trial's group, per worker of ``--gpus``); empty:
                one at a time on ``search.device``.
            add_trials: create the study if missing and raise its target by
                ``search.num_trials`` (``search``); False only joins it (``worker``).
        """
        self.search = search
        self.store = store
        self.observer = observer or SearchObserver()
        self.on_trial = self.observer.trial_done
        self.on_phase = self.observer.phase
        self.runs_dir = Path(search.runs_dir).resolve() / search.study_name
        self.done = 0
        self.total = search.num_trials
        self.abort: BudgettuneError | None = None
        self.running_trial: int | None = None  # the trial this process runs, while it runs
        self.devices = tuple(devices)
        self.cpu_shares = cpu_shares(self.devices)  # for the fresh runs on each (several GPUs)
        self.fresh_slots = max(1, len(self.devices))  # fresh runs at once: 1 on one device
        # pre-imported servers this process's trials and fresh runs fork from (the first
        # trial of an environment starts one, and forks from it once it is ready)
        self.servers = trial_servers(search.trial_run(search.base), self.runs_dir / "servers")
        self.live_key: str | None = None  # its entry among the study's live searches
        self.claim = ClaimLock(store.url, search.study_name)
        self.claim.acquire()
        try:
            with database_errors(store.url):
                self.study, created = open_study(
                    search, store, create=add_trials, heartbeat_s=self.heartbeat_s
                )
                if add_trials and search.num_trials > 0:  # --trials 0 leaves the target be
                    self.live_key = live_searches.add_to_target(
                        self.study, self.count(), search, self.observer.notice, created=created
                    )
        finally:
            self.claim.release()

    @property
    def heartbeat_s(self) -> int:
        """The trial heartbeat of this process's storage."""
        return int(self.store.optuna_storage.heartbeat_interval or HEARTBEAT_INTERVAL_S)

    def count(self) -> TrialCount:
        """The study against its target (call under the claim lock for a decision)."""
        return study_count(
            self.study, trial_timeout_s=self.search.trial_timeout_s, heartbeat_s=self.heartbeat_s
        )

    def unconstrained(self) -> TrialRecord | None:
        """The unconstrained baseline's record, once it has a first-step loss."""
        return unconstrained_baseline(self.study.get_trials(deepcopy=False), measured="loss")

    def spec_for(self, trial: optuna.Trial) -> TrialSpec:
        enqueued, search = trial.user_attrs.get(ENQUEUED_SPEC_ATTR), self.search
        if enqueued is not None:  # measured as queued; the params matched to the distributions
            with contextlib.suppress(ValueError):  # (unless it was queued out of them)
                suggest_spec(trial, search.space, search.base)
            return TrialSpec.from_json_dict(enqueued)
        space = sampling_space(search, self.study.user_attrs)
        drawn = suggest_for_target(trial, space, search.base, search.space, search.target)
        return search.batched(drawn)

    def objective(self, trial: optuna.Trial) -> float:
        # Optuna has created (or popped) this trial: the next worker may claim now.
        self.claim.release()
        self.running_trial = trial.number
        trial.set_user_attr(WORKER_ATTR, f"{socket.gethostname()}:{self.search.device}")
        spec = self.spec_for(trial)
        try:
            result = launch_trial(
                self.search.trial_run(spec),
                run_dir=self.runs_dir / f"trial-{trial.number:04d}",
                timeout_s=self.search.trial_timeout_s,
                servers=self.servers,
            )
        except TrialInfrastructureError as exc:
            trial.set_user_attr(ERROR_ATTR, str(exc))  # what `show` says of the failed trial
            raise TrialInfrastructureError(
                f"trial {trial.number}: {exc}; nothing is excluded, finished trials are kept, "
                "and the next search runs the trial again"
            ) from exc
        self.done += 1  # it ran here, even if another process has failed the trial meanwhile
        is_reference = trial.user_attrs.get(BASELINE_ATTR) == UNCONSTRAINED
        if not is_reference:
            result = check_numerics(result, reference_at(self.unconstrained(), spec))
        self._store(trial.number, "trial", spec, result)
        for key, attr in result_attrs(spec, result).items():
            trial.set_user_attr(key, attr)
        limit = self.search.max_mem_bytes
        if result.measurement is not None:
            violation = measured_violation_bytes(
                result.measurement,
                limit_bytes=limit,
                mem_metric=self.search.mem_metric,
                margin=self.search.margin,
                host_limit_bytes=self.search.host_limit_bytes,
            )
            if result.outcome is TrialOutcome.NUMERICS_MISMATCH:
                violation = max(violation, 0.0) + 1.0
        elif result.outcome.is_infeasible_result():  # OOM, non-finite loss: no figures
            violation = float(limit)
        else:
            self._emit(trial.number, spec, result)
            if result.outcome is TrialOutcome.CRASHED:
                remember_crashes(self.study, self.observer.notice)
                if trial.user_attrs.get(BASELINE_ATTR) == HIGH_BUDGET:
                    retry_high_budget(self.study, self.search, self.observer.notice)
            if result.failed_stage == "workload":
                # Every configuration would fail alike (on a GPU a build can take minutes).
                self.abort = WorkloadFailedError(
                    f"trial {trial.number}: the workload {self.search.workload} could not be "
                    f"loaded: {result.error} (log: {result.log_path}); the trial is kept in "
                    "the study; fix the workload and run the search again"
                )
                self.study.stop()
            raise TrialFailed(f"{result.outcome.value}: {result.error}")
        trial.set_user_attr(CONSTRAINT_ATTR, [violation])
        self._emit(trial.number, spec, result, fits=violation <= 0)
        if result.measurement is not None and self._below_steady(result):
            self.study.stop()
        rows = self.search.ranking_rows  # samples per second, where trials differ in rows
        if violation > 0:
            # Does not fit: pruned, never Optuna's "best trial" (the sampler ranks it by the
            # stored constraint); its step time, if any, is its intermediate value.
            if result.measurement is not None:
                trial.report(spec.ranked_ms(result.measurement.step_time_ms, rows), step=0)
            raise optuna.TrialPruned(f"does not fit: {result.outcome.value}")
        assert result.measurement is not None
        return spec.ranked_ms(result.measurement.step_time_ms, rows)

    def _below_steady(self, result: TrialResult) -> bool:
        """A limit under params + grads + optimizer state: stop the study, keep the trial."""
        assert result.measurement is not None
        error = steady_error(self.search.max_mem_bytes, result.measurement.steady_bytes)
        if error is not None:
            self.abort = error
        return error is not None

    def _store(self, number: int | None, kind: str, spec: TrialSpec, result: TrialResult) -> None:
        search, fingerprint = self.search, result.workload_fingerprint
        digest = None
        if fingerprint:
            digest = self.store.record_workload(
                ref=search.workload, options=search.workload_options, fingerprint=fingerprint
            )
        self.store.record_measurement(
            study_name=search.study_name,
            trial_number=number,
            kind=kind,
            workload_digest=digest,
            spec=spec,
            result=result,
        )

    def _emit(
        self, number: int, spec: TrialSpec, result: TrialResult, *, fits: bool | None = None
    ) -> None:
        self.on_trial(
            TrialEvent(
                number=number,
                done=self.done,
                total=self.total,
                spec=spec,
                result=result,
                best_ms=self.best_feasible_ms(),
                fits=fits,
                mem_metric=self.search.mem_metric,
            )
        )

    def best_feasible_ms(self) -> float | None:
        """Fastest feasible step time in the study so far (as the search ranks it)."""
        return best_feasible_ms(self.study.get_trials(deepcopy=False), self.search.ranking_rows)

    # -- the whole run -------------------------------------------------------------------
    def run_trials(self, max_trials: int | None = None) -> None:
        """Run trials until the study's target is met (or ``max_trials`` of them ran here).

        Every decision to start a trial is taken under the claim lock, after failing stale
        trials (Optuna re-queues each once); with nothing to start while other workers'
        trials run, wait: one of them may die and be re-queued.

        Raises:
            UsageError: the limit is below the workload's steady memory.
            StorageError: the database went away (finished trials stay stored).
        """
        self.check_steady()
        while max_trials is None or self.done < max_trials:
            self.claim.acquire()
            try:
                with database_errors(self.store.url):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                        optuna.storages.fail_stale_trials(self.study)
                    step = self.count().next_step()
                    if step is NextStep.STOP:
                        break
                    if step is NextStep.WAIT:
                        self.claim.release()
                        time.sleep(WAIT_POLL_S)
                        continue
                    plan_opening(self.study, self.search, self.observer.notice)
                    live_searches.touch(self.study, self.live_key)
                    self.run_one_trial()
            finally:
                self.claim.release()
            if self.abort is not None:
                raise self.abort
            self.publish()

    def run_one_trial(self) -> None:
        """One ask → launch → tell; a trial another process failed meanwhile is let go.

        Another worker's stale-trial check can fail this process's running trial (its
        heartbeat missed, e.g. a host paused); Optuna then refuses to tell it (`ValueError`).
        The measurement is already stored; the trial is re-run, so the loop goes on. Any other
        `ValueError` came from the objective itself and is raised."""
        self.running_trial = None
        try:
            self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,))
        except (KeyboardInterrupt, TrialInfrastructureError):
            if self.running_trial is not None:  # not its configuration's fault: run it again
                requeue_unfinished(self.study, self.store.optuna_storage, self.running_trial)
            raise
        except ValueError as exc:
            number = self.running_trial
            if number is None or not str(exc).startswith("Cannot tell a FAIL trial"):
                raise  # the objective's own error, not a tell refused after a stale check
            frozen = stored_trial(self.study, self.store.optuna_storage, number)
            if frozen.state != optuna.trial.TrialState.FAIL:
                raise
            self.observer.notice(
                f"trial {number} was failed by another process's stale-trial check "
                "while it ran here (a missed heartbeat); its measurement is kept and the "
                "trial is re-run"
            )

    def publish(self) -> None:
        """Refresh the study's dashboard views; a failure is logged, never fatal."""
        refresh_views(self.store, self.search.study_name)

    def check_steady(self) -> None:
        """Refuse a limit below the steady memory some earlier trial measured."""
        check_steady(self.study, self.search.max_mem_bytes)

    def fresh_batch(
        self, jobs: Sequence[FreshJob], runs: int | None = None
    ) -> list[list[TrialResult]]:
        """Measure each job ``runs`` times (default ``--reverify``) in fresh processes over every
        device slot at once, each stored as a ``reverify`` of its trial as it comes (numerics
        checked where asked); runs stored for it on this GPU model and torch count."""
        search = self.search
        kept = stored_runs(self.store, search.study_name, jobs)
        wanted = search.reverify_runs if runs is None else runs
        found = self.unconstrained()  # read once for the whole batch

        def finish(index: int, result: TrialResult) -> TrialResult:
            return self.keep_run(jobs[index], result, found)

        fresh = run_batch(
            cold_once(jobs, kept),
            runs=[max(0, wanted - len(old)) for old in kept],
            make_run=search.trial_run,
            runs_dir=self.runs_dir,
            devices=self.devices,
            launch=launcher(
                search.trial_timeout_s, self.servers, self.cpu_shares, search.trials_per_gpu
            ),
            on_phase=self.on_phase,
            finish=finish,
            first_repeat=[len(old) for old in kept],
        )
        return [(old + new)[:wanted] for old, new in zip(kept, fresh, strict=True)]

    def keep_run(self, job: FreshJob, result: TrialResult, ref: TrialRecord | None) -> TrialResult:
        """Store a fresh run as a ``reverify`` of its trial (numerics checked against the
        unconstrained baseline ``ref`` where the job asks)."""
        if job.check:
            result = check_numerics(result, reference_at(ref, job.spec))
        self._store(job.number, "reverify", job.spec, result)
        return result

    def close(self) -> None:
        """Stop this process's trial servers and drop its live-search entry (the study and
        its storage stay as they are)."""
        if self.servers is not None:
            self.servers.close()
        live_searches.leave(self.study, self.claim, self.live_key)
        self.live_key = None

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pin(self) -> dict[str, Any]:
        """Re-verify the fastest fitting trials and pin one (`budgettune.study.pin`): its JSON."""
        return pin_study(self).to_json_dict()
