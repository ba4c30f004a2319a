"""The study: create or resume, baselines first, ask → launch → tell, then re-verify and pin.

Optuna minimises the median step time with the constraint ``peak − limit ≤ 0`` on the chosen
memory metric (its constraint support, not a penalty). OOM and numerics-mismatch trials are
complete-and-infeasible, so the sampler learns the boundary; crashes and timeouts are failed
trials with the reason in user attrs. Every measurement also lands in our ``bt_measurements``.
This module never prints: progress goes to a callback the CLI renders.
"""

from __future__ import annotations

import datetime
import logging
import math
import socket
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import NoFeasibleConfigError, UsageError
from budgettune.launcher import check_device_available, check_ops_exist, launch_trial
from budgettune.pinning import (
    Candidate,
    build_pin,
    choose_pin,
    phase_advice,
)
from budgettune.results import TrialOutcome, TrialResult
from budgettune.search_space import suggest_spec
from budgettune.spec import SearchSpec, TrialSpec
from budgettune.storage.coordination import ClaimLock, creation_lock, database_errors
from budgettune.study_trials import (
    BASELINE_ATTR,
    UNCONSTRAINED,
    best_feasible_ms,
    feasible_candidates,
    smallest_peak,
    unconstrained_baseline,
)
from budgettune.trial_target import TARGET_ATTR, NextStep, TrialCount, count_trials
from budgettune.units import format_bytes
from budgettune.workload import check_reference

logger = logging.getLogger(__name__)

#: Objective value of a trial with no time (OOM): infeasible anyway, ranked by its violation.
NO_TIME_MS = 1.0e7
SEARCH_ATTR = "search"
"""Study user attr: what must stay the same when the study is resumed (`study_attrs`)."""
SPEC_ATTR = "search_spec"
"""Study user attr: the whole `SearchSpec` (JSON, no storage URL), read by workers."""
WORKER_ATTR = "worker"
"""Trial user attr: ``host:device`` of the worker that ran it (throughput per worker)."""
HEARTBEAT_INTERVAL_S = 10
"""Optuna trial heartbeat; a trial silent for twice this is failed and retried once."""
WAIT_POLL_S = 2.0
"""How often a worker with nothing to start looks again while others' trials run."""


class TrialFailed(Exception):
    """Raised inside the objective for a crashed or timed-out trial: Optuna marks it FAIL."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialEvent:
    """What the progress display gets after each trial."""

    number: int
    """Optuna trial number."""
    done: int
    """Trials finished in this invocation."""
    total: int
    """Trials this invocation will run."""
    spec: TrialSpec
    """The configuration measured."""
    result: TrialResult
    """Its result (numerics already checked)."""
    best_ms: float | None
    """Fastest feasible step time so far in the study."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOutcome:
    """What a finished search produced."""

    study_name: str
    """The study."""
    storage_url: str
    """Where it is stored (password masked)."""
    trials_run: int
    """Trials finished by this invocation (by its workers, with ``--gpus``)."""
    pin: dict[str, Any]
    """The pinned config document (schema version 1)."""


def study_attrs(search: SearchSpec) -> dict[str, Any]:
    """What must stay the same when a study is resumed."""
    return {
        "workload": search.workload,
        "workload_options": dict(search.workload_options),
        "max_mem_bytes": search.max_mem_bytes,
        "mem_metric": search.mem_metric,
    }


def default_study_name(
    workload: str, options: dict[str, Any], device: str, max_mem_bytes: int, metric: str
) -> str:
    """A stable name, so re-running the same command resumes the same study."""
    name = workload.split(":", 1)[-1] if workload.startswith("builtin:") else workload
    name = Path(name.split(":", 1)[0]).stem if ".py" in name else name.replace(":", "-")
    extra = "".join(f"-{k}{v}" for k, v in sorted(options.items()))
    return f"{name}{extra}-{device.split(':')[0]}-{max_mem_bytes / 1e6:.0f}MB-{metric}"


def make_sampler(search: SearchSpec) -> optuna.samplers.BaseSampler:
    """TPE with Optuna's constraint support and the constant liar for parallel workers."""
    with warnings.catch_warnings():
        # `group` is experimental, `warn_independent_sampling` and `constraints_func` are
        # deprecated in Optuna 5.0 but still the documented way; say so once, not every run.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return optuna.samplers.TPESampler(
            seed=search.sampler_seed,
            n_startup_trials=max(3, min(8, search.num_trials // 3)),
            multivariate=True,
            group=True,
            constant_liar=True,
            constraints_func=constraints_of,
            warn_independent_sampling=False,
        )


def constraints_of(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    """Optuna constraint: ``peak − limit`` (≤ 0 is feasible), stored by the objective."""
    return trial.user_attrs.get("constraint", [math.inf])


def baseline_specs(search: SearchSpec) -> list[tuple[str, TrialSpec]]:
    """The configurations every study measures first.

    ``unconstrained`` (compile at budget 1.0, optimizer as written unless fixed) is the
    reference for slowdown and numerics; block AC every 1 and budget 0.5 are the usual hand
    picks.
    """
    fixed = search.space.fixed
    base = search.base.replace(
        activation_memory_budget=1.0,
        compile_mode=fixed.get("compile_mode", "default"),
        compile_backend=fixed.get("compile_backend", search.space.compile_backend),
        optimizer_impl=fixed.get("optimizer_impl", "as_written"),
        cuda_alloc_conf=fixed.get("cuda_alloc_conf", ""),
        block_ac_every=0,
    )
    specs = [
        (UNCONSTRAINED, base),
        ("block-ac-every-1", base.replace(block_ac_every=1)),
        ("budget-0.5", base.replace(activation_memory_budget=0.5)),
    ]
    return specs


def numerics_tolerance(fingerprint: dict[str, Any] | None) -> float:
    """Relative tolerance for first-step loss / grad norm vs the budget-1.0 reference.

    Recompute changes the order of floating-point work; 16-bit parameters drift much more.
    """
    if fingerprint and fingerprint.get("param_count"):
        bytes_per_param = fingerprint["param_bytes"] / fingerprint["param_count"]
        if bytes_per_param < 4:
            return 3e-2
    return 1e-3


def check_numerics(result: TrialResult, reference: dict[str, float] | None) -> TrialResult:
    """Mark a measured result ``numerics_mismatch`` when it is off the study's reference."""
    m = result.measurement
    if reference is None or m is None or result.outcome is not TrialOutcome.OK:
        return result
    tolerance = numerics_tolerance(
        dict(result.workload_fingerprint) if result.workload_fingerprint else None
    )
    for name in ("loss", "grad_norm"):
        expected, got = reference[name], getattr(m, name)
        if not math.isfinite(got) or abs(got - expected) > tolerance * max(abs(expected), 1e-12):
            return result.replace(
                outcome=TrialOutcome.NUMERICS_MISMATCH,
                error=(
                    f"first-step {name} {got:.6g} is off the budget-1.0 reference {expected:.6g} "
                    f"(tolerance {tolerance:g} relative)"
                ),
            )
    return result


def result_attrs(spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """Everything measured, as trial user attrs any Optuna tool can read."""
    attrs: dict[str, Any] = {
        "outcome": result.outcome.value,
        "error": result.error,
        "spec": spec.to_json_dict(),
        "log_path": result.log_path,
        "wall_s": round(result.wall_s, 3),
        "device_name": result.device_name,
        "torch_version": result.torch_version,
    }
    m = result.measurement
    if m is not None:
        attrs.update(
            {
                "peak_allocated_bytes": m.peak_allocated_bytes,
                "peak_reserved_bytes": m.peak_reserved_bytes,
                "peak_device_bytes": m.peak_device_bytes,
                "steady_bytes": m.steady_bytes,
                "phase_peak_bytes": dict(m.phase_peak_bytes),
                "peak_phase": m.peak_phase,
                "step_time_ms": m.step_time_ms,
                "step_time_p10_ms": m.step_time_p10_ms,
                "step_time_p90_ms": m.step_time_p90_ms,
                "compile_s": m.compile_s,
                "loss": m.loss,
                "grad_norm": m.grad_norm,
            }
        )
    return attrs


class SearchObserver:
    """Receives a search's progress (the CLI renders it); the default ignores everything."""

    def started(self, study_name: str, total: int) -> None:
        """The storage and study are open; ``total`` trials are about to run."""

    def trial_done(self, event: TrialEvent) -> None:
        """One trial finished (whatever its outcome)."""

    def phase(self, text: str) -> None:
        """A new phase began (e.g. re-verification)."""

    def trials_finished(self, done: int, best_ms: float | None) -> None:
        """``done`` trials finished by this invocation's workers (``--gpus``)."""


class Searcher:
    """One invocation of a search over an opened storage (kept small: see `run_search`)."""

    def __init__(
        self,
        search: SearchSpec,
        store: storage_mod.Storage,
        observer: SearchObserver | None = None,
        *,
        add_trials: bool = True,
    ) -> None:
        """Open the study.

        Args:
            search: the whole search.
            store: the open storage.
            observer: receives progress.
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
        self.abort: UsageError | None = None
        self.claim = ClaimLock(store.url, search.study_name)
        self.claim.acquire()
        try:
            with database_errors(store.url):
                self.study, created = self._open_study(add_trials)
                if add_trials:
                    # A new study's baselines are part of its first --trials; on a resumed
                    # study, baselines still queued are not "before": --trials N runs N.
                    count = self.count()
                    before = 0 if created else count.counted - count.waiting
                    self.study.set_user_attr(TARGET_ATTR, before + search.num_trials)
        finally:
            self.claim.release()

    # -- study ---------------------------------------------------------------------------
    def _open_study(self, create: bool) -> tuple[optuna.Study, bool]:
        """Create the study (attrs, baselines) or load it; called under the claim lock.

        Only the process whose ``create_study`` succeeds enqueues the baselines, so two
        searches racing to create one study queue them once.
        """
        common: dict[str, Any] = dict(
            study_name=self.search.study_name,
            storage=self.store.optuna_storage,
            sampler=make_sampler(self.search),
        )
        if create:
            try:
                study = optuna.create_study(direction="minimize", load_if_exists=False, **common)
            except optuna.exceptions.DuplicatedStudyError:
                pass
            else:
                study.set_user_attr(SEARCH_ATTR, study_attrs(self.search))
                study.set_user_attr(SPEC_ATTR, self.search.to_json_dict())
                for label, spec in baseline_specs(self.search):
                    study.enqueue_trial(
                        _enqueue_params(spec, self.search),
                        user_attrs={BASELINE_ATTR: label, "enqueued_spec": spec.to_json_dict()},
                    )
                return study, True
        study = optuna.load_study(**common)
        if not create:
            return study, False
        wanted = study_attrs(self.search)
        stored = study.user_attrs.get(SEARCH_ATTR)
        if stored is None:
            study.set_user_attr(SEARCH_ATTR, wanted)
        elif stored != wanted:
            diff = ", ".join(
                f"{k}: stored {stored.get(k)!r} vs given {v!r}"
                for k, v in wanted.items()
                if stored.get(k) != v
            )
            raise UsageError(
                f"study {self.search.study_name!r} was made for another search ({diff}); "
                "pass --study NAME to start a new one"
            )
        # Workers read the spec of the newest search that raised the target.
        study.set_user_attr(SPEC_ATTR, self.search.to_json_dict())
        return study, False

    def target(self) -> int:
        """The study's trial target (a study made before targets: what it has)."""
        stored = self.study.user_attrs.get(TARGET_ATTR)
        return int(stored) if stored is not None else len(self.study.trials)

    def count(self) -> TrialCount:
        """The study against its target (call under the claim lock for a decision)."""
        grace_s = 2 * (self.store.optuna_storage.heartbeat_interval or HEARTBEAT_INTERVAL_S)
        alive_after = datetime.datetime.now() - datetime.timedelta(
            seconds=self.search.trial_timeout_s + 2 * grace_s
        )
        return count_trials(
            self.study.get_trials(deepcopy=False),
            target=self.target(),
            alive_after=alive_after,
        )

    def reference(self) -> dict[str, float] | None:
        """First-step loss and grad norm of the study's unconstrained baseline, if measured."""
        attrs = unconstrained_baseline(self.study.get_trials(deepcopy=False), measured="loss")
        return None if attrs is None else {"loss": attrs["loss"], "grad_norm": attrs["grad_norm"]}

    # -- one trial -----------------------------------------------------------------------
    def spec_for(self, trial: optuna.Trial) -> TrialSpec:
        enqueued = trial.user_attrs.get("enqueued_spec")
        if enqueued is not None:
            # Baselines are measured exactly as defined, whatever the space would suggest;
            # suggest_spec still runs so the params match the distributions.
            suggest_spec(trial, self.search.space, self.search.base)
            return TrialSpec.from_json_dict(enqueued)
        return suggest_spec(trial, self.search.space, self.search.base)

    def objective(self, trial: optuna.Trial) -> float:
        # Optuna has created (or popped) this trial: the next worker may claim now.
        self.claim.release()
        trial.set_user_attr(WORKER_ATTR, f"{socket.gethostname()}:{self.search.device}")
        spec = self.spec_for(trial)
        result = launch_trial(
            self.search.trial_run(spec),
            run_dir=self.runs_dir / f"trial-{trial.number:04d}",
            timeout_s=self.search.trial_timeout_s,
        )
        is_reference = trial.user_attrs.get(BASELINE_ATTR) == UNCONSTRAINED
        if not is_reference:
            result = check_numerics(result, self.reference())
        self._store(trial.number, "trial", spec, result)
        for key, attr in result_attrs(spec, result).items():
            trial.set_user_attr(key, attr)
        self.done += 1
        limit = self.search.max_mem_bytes
        value: float
        if result.measurement is not None:
            violation = float(result.measurement.peak_bytes(self.search.mem_metric) - limit)
            if result.outcome is TrialOutcome.NUMERICS_MISMATCH:
                violation = max(violation, 0.0) + 1.0
            trial.set_user_attr("constraint", [violation])
            value = result.measurement.step_time_ms
        elif result.outcome is TrialOutcome.OOM:
            trial.set_user_attr("constraint", [float(limit)])
            value = NO_TIME_MS
        else:
            self._emit(trial.number, spec, result)
            raise TrialFailed(f"{result.outcome.value}: {result.error}")
        self._emit(trial.number, spec, result)
        if result.measurement is not None and self._below_steady(result):
            self.study.stop()
        return value

    def _below_steady(self, result: TrialResult) -> bool:
        """A limit under params + grads + optimizer state: stop the study, keep the trial."""
        m = result.measurement
        assert m is not None
        if m.steady_bytes >= self.search.max_mem_bytes:
            self.abort = UsageError(
                f"--max-mem {format_bytes(self.search.max_mem_bytes)} is below the workload's "
                f"steady memory {format_bytes(m.steady_bytes)} (parameters + gradients + "
                "optimizer state): no recompute setting can fit; raise the limit"
            )
            return True
        return False

    def _store(self, number: int | None, kind: str, spec: TrialSpec, result: TrialResult) -> None:
        digest = None
        if result.workload_fingerprint:
            digest = self.store.record_workload(
                ref=self.search.workload,
                options=self.search.workload_options,
                fingerprint=result.workload_fingerprint,
            )
        self.store.record_measurement(
            study_name=self.search.study_name,
            trial_number=number,
            kind=kind,
            workload_digest=digest,
            spec=spec,
            result=result,
        )

    def _emit(self, number: int, spec: TrialSpec, result: TrialResult) -> None:
        self.on_trial(
            TrialEvent(
                number=number,
                done=self.done,
                total=self.total,
                spec=spec,
                result=result,
                best_ms=self.best_feasible_ms(),
            )
        )

    def best_feasible_ms(self) -> float | None:
        """Fastest feasible step time in the study so far."""
        return best_feasible_ms(self.study.get_trials(deepcopy=False))

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
                    self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,))
            finally:
                self.claim.release()
            if self.abort is not None:
                raise self.abort
            self.publish()

    def publish(self) -> None:
        """Refresh the study's dashboard views; a failure is logged, never fatal."""
        from budgettune.dashboard import publish_views

        try:
            publish_views(self.store, self.search.study_name)
        except Exception as exc:  # noqa: BLE001 - the views are a nicety; the search must go on
            # One line: a storage outage also stops the search right after, with its own line;
            # the traceback is there for `--debug`.
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning("could not refresh the dashboard views: %s", reason)
            logger.debug("dashboard views traceback", exc_info=True)

    def check_steady(self) -> None:
        """Refuse a limit below the steady memory some earlier trial measured."""
        for trial in self.study.get_trials(deepcopy=False):
            steady = trial.user_attrs.get("steady_bytes")
            if steady is not None and steady >= self.search.max_mem_bytes:
                raise UsageError(
                    f"--max-mem {format_bytes(self.search.max_mem_bytes)} is below the "
                    f"workload's steady memory {format_bytes(steady)} (parameters + gradients "
                    "+ optimizer state, measured in trial "
                    f"{trial.number}): no recompute setting can fit; raise the limit"
                )

    def reverify(self, candidates: list[Candidate]) -> dict[int, list[TrialResult]]:
        """Re-measure the top-k candidates R times each, in fresh processes."""
        return {
            c.trial_number: self._fresh_runs(
                c.spec,
                number=c.trial_number,
                run_name=f"reverify-{c.trial_number:04d}",
                phase=f"re-verifying trial {c.trial_number}",
            )
            for c in candidates[: self.search.top_k]
        }

    def _fresh_runs(
        self, spec: TrialSpec, *, number: int, run_name: str, phase: str, check: bool = True
    ) -> list[TrialResult]:
        """Measure ``spec`` R times in fresh processes, each stored as a ``reverify`` of trial
        ``number``; ``check`` compares each run's numerics with the study's reference."""
        results = []
        runs = self.search.reverify_runs
        for repeat in range(runs):
            self.on_phase(f"{phase} ({repeat + 1}/{runs})")
            result = launch_trial(
                self.search.trial_run(spec),
                run_dir=self.runs_dir / f"{run_name}-{repeat}",
                timeout_s=self.search.trial_timeout_s,
            )
            if check:
                result = check_numerics(result, self.reference())
            self._store(number, "reverify", spec, result)
            results.append(result)
        return results

    def remeasure_baseline(
        self,
        trials: Sequence[optuna.trial.FrozenTrial],
        candidates: Sequence[Candidate],
        reverified: dict[int, list[TrialResult]],
    ) -> list[TrialResult]:
        """The unconstrained baseline measured as often as the pin, so the slowdown compares
        medians of the same number of fresh processes (one trial's noise is not the baseline).

        Reuses the re-verification of a candidate that *is* the baseline configuration.
        """
        trial = next(
            (
                t
                for t in trials
                if t.user_attrs.get(BASELINE_ATTR) == UNCONSTRAINED
                and "step_time_ms" in t.user_attrs  # the trial `unconstrained_baseline` reads
            ),
            None,
        )
        if trial is None:
            return []
        spec = TrialSpec.from_json_dict(trial.user_attrs["spec"])
        for candidate in candidates:
            if candidate.spec == spec and candidate.trial_number in reverified:
                return list(reverified[candidate.trial_number])
        # the baseline is the numerics reference itself: nothing to compare it with
        return self._fresh_runs(
            spec,
            number=trial.number,
            run_name=f"reverify-baseline-{trial.number:04d}",
            phase="re-measuring the unconstrained baseline",
            check=False,
        )

    def pin(self) -> dict[str, Any]:
        trials = self.study.get_trials(deepcopy=False)
        candidates = feasible_candidates(trials, self.search.mem_metric)
        if not candidates:
            raise self.no_feasible_error()
        reverified = self.reverify(candidates)
        chosen = choose_pin(
            candidates[: self.search.top_k],
            reverified,
            limit_bytes=self.search.max_mem_bytes,
            mem_metric=self.search.mem_metric,
            margin=self.search.margin,
        )
        if chosen is None:
            raise self.no_feasible_error(after_reverify=True)
        candidate, results = chosen
        pin = build_pin(
            search=self.search,
            candidate=candidate,
            reverify_results=results,
            baseline=unconstrained_baseline(trials),
            baseline_results=self.remeasure_baseline(trials, candidates, reverified),
            trials=len(self.study.trials),
        )
        self.store.record_pin(
            study_name=self.search.study_name,
            pin=pin,
            peak_bytes=pin["measured"]["peak_worst_bytes"],
            step_time_ms=pin["measured"]["step_time_ms"],
            slowdown=pin["baseline"]["slowdown"] if pin["baseline"] else None,
            limit_bytes=self.search.max_mem_bytes,
            mem_metric=self.search.mem_metric,
        )
        return pin

    def no_feasible_error(self, *, after_reverify: bool = False) -> NoFeasibleConfigError:
        smallest = smallest_peak(self.study.get_trials(deepcopy=False), self.search.mem_metric)
        limit = format_bytes(self.search.max_mem_bytes)
        if smallest is None:
            return NoFeasibleConfigError(
                f"no configuration could be measured under {limit} "
                f"(every trial failed; see the logs under {self.runs_dir})"
            )
        peak, spec, phase = smallest
        what = "re-verified" if after_reverify else "measured"
        advice = phase_advice(phase)
        return NoFeasibleConfigError(
            f"no {what} configuration fits under {limit} ({self.search.mem_metric}); the "
            f"smallest peak seen is {format_bytes(peak)} from {spec.describe()}"
            + (f"; {advice}" if advice else "")
            + "; raise --max-mem or run more --trials"
        )


def _enqueue_params(spec: TrialSpec, search: SearchSpec) -> dict[str, Any]:
    from budgettune.search_space import spec_params

    return spec_params(spec, search.space)


def run_search(
    search: SearchSpec, observer: SearchObserver | None = None, *, gpus: Sequence[int] = ()
) -> SearchOutcome:
    """Raise the study's target by ``search.num_trials``, run trials to it, re-verify, pin.

    Args:
        search: the whole search.
        observer: receives progress (the CLI's progress bar).
        gpus: run one worker process per GPU index on this host (``--gpus 0,1``) instead of
            trials in this process; re-verification then runs on ``search.device``.

    Returns:
        The `SearchOutcome` with the pinned config document.

    Raises:
        UsageError: bad input (reference, device, a limit under the steady memory).
        StorageError: the storage cannot be used (unreachable, schema behind or ahead, lost).
        NoFeasibleConfigError: nothing fits under the limit.
        WorkerFailedError: with ``gpus``, workers exited before the target was met.
        KeyboardInterrupt: after the running trial is marked failed; finished ones are kept.
    """
    check_reference(search.workload)
    if gpus:
        from budgettune.workers import check_gpus

        check_gpus(gpus)
    check_device_available(search.device)
    check_ops_exist(search.space.removable_ops + search.space.addable_ops)
    with creation_lock(search.storage_url):
        store = storage_mod.open_storage(
            search.storage_url, heartbeat_interval_s=HEARTBEAT_INTERVAL_S
        )
    searcher = Searcher(search, store, observer)
    if gpus:
        from budgettune.workers import run_gpu_workers

        searcher.observer.started(search.study_name, search.num_trials)
        trials_run = run_gpu_workers(searcher, gpus)
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
