"""The end of a search: re-verify the fastest fitting trials in fresh processes, pin one.

Re-verification walks down the feasible trials, fastest first: the top ``--top-k`` together,
then one more at a time, until one qualifies (every fresh run ``ok``, the worst peak fits the
limit with the margin) or `MAX_CANDIDATES` have been re-measured. Only when nothing qualifies
does the search end with exit 3 (exit 4 when no trial could be measured at all). The
references the pin reports its slowdown against (the unconstrained baseline, full block AC
when that baseline cannot run under the limit, and torchtitan's op SAC in a sharded study)
are re-measured as often as the pin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna

from budgettune.errors import NoFeasibleConfigError, NothingMeasuredError
from budgettune.pinning import (
    Candidate,
    PinDocument,
    PinScope,
    ReferenceTrial,
    build_pin,
    choose_pin,
    phase_advice,
)
from budgettune.search.fresh import FreshJob
from budgettune.search.spec import SearchSpec
from budgettune.storage.trials import (
    FULL_AC,
    OP_SAC,
    UNCONSTRAINED,
    TrialRecord,
    baseline_status,
    baseline_trial,
    feasible_candidates,
    metric_peak,
    record_of,
    smallest_peak,
)
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.units import format_bytes, format_percent

MAX_CANDIDATES = 8
"""At most this many feasible configurations are re-measured (or ``--top-k``, if larger)
before the search gives up with exit 3: each costs ``--reverify`` fresh runs."""


class StudyTrials(Protocol):
    """The study's trials (an `optuna.Study`)."""

    def get_trials(self, deepcopy: bool = ...) -> list[optuna.trial.FrozenTrial]:
        """Every trial of the study."""
        ...


class PinRecorder(Protocol):
    """Where the pin is recorded (a `budgettune.storage.Storage`)."""

    def record_pin(
        self,
        *,
        study_name: str,
        pin: Mapping[str, Any],
        peak_bytes: int,
        step_time_ms: float,
        slowdown: float | None,
        limit_bytes: int,
        mem_metric: str,
    ) -> int:
        """Store the pin's JSON with its headline figures."""
        ...


class Notices(Protocol):
    """Receives one-line notices (a `search.study.SearchObserver`)."""

    def notice(self, text: str) -> None:
        """Something the user should read as it happens."""
        ...


class PinSteps(Protocol):
    """What the pin step needs of a search (the `Searcher` has it): the search's spec, its
    study's trials, fresh re-measurements, somewhere to say what it does and to record the
    pin, and the run folder its errors point to."""

    @property
    def search(self) -> SearchSpec:
        """The search: its limit, metric, margin, ``--top-k``, workload and study name."""
        ...

    @property
    def study(self) -> StudyTrials:
        """The study's trials."""
        ...

    @property
    def store(self) -> PinRecorder:
        """Where the pin is recorded."""
        ...

    @property
    def observer(self) -> Notices:
        """Where notices go."""
        ...

    @property
    def runs_dir(self) -> Path:
        """The study's run folder (trial logs)."""
        ...

    def fresh_batch(self, jobs: Sequence[FreshJob]) -> list[list[TrialResult]]:
        """Measure each job ``--reverify`` times in fresh processes."""
        ...


def reverify_until_one_fits(
    searcher: PinSteps, candidates: Sequence[Candidate]
) -> tuple[tuple[Candidate, list[TrialResult]], dict[int, list[TrialResult]]] | None:
    """Re-measure candidates (fastest first) until one qualifies; None when none does.

    The top-k go out as one batch (in parallel over the search's GPUs), then one at a time.

    Returns:
        The winner with its runs, and every re-measurement made (by trial number).
    """
    search = searcher.search
    bound = min(max(search.top_k, MAX_CANDIDATES), len(candidates))
    reverified: dict[int, list[TrialResult]] = {}
    tried: list[Candidate] = []
    index = 0
    while index < bound:
        batch = list(candidates[index : max(index + 1, min(search.top_k, bound))])
        if index >= search.top_k:
            searcher.observer.notice(
                f"none of the {len(tried)} fastest fitting trials held under "
                f"{format_bytes(search.max_mem_bytes)} with the "
                f"{format_percent(search.margin)} margin "
                f"when re-measured; trying trial {batch[0].trial_number} "
                f"({index + 1}/{bound}, "
                f"{batch[0].step_time_ms:.1f} ms, {format_bytes(batch[0].peak_bytes)})"
            )
        runs = searcher.fresh_batch(
            [
                FreshJob(
                    spec=c.spec,
                    number=c.trial_number,
                    run_name=f"reverify-{c.trial_number:04d}",
                    phase=f"re-verifying trial {c.trial_number}",
                )
                for c in batch
            ]
        )
        for candidate, results in zip(batch, runs, strict=True):
            reverified[candidate.trial_number] = results
        tried.extend(batch)
        index += len(batch)
        chosen = choose_pin(
            tried,
            reverified,
            limit_bytes=search.max_mem_bytes,
            mem_metric=search.mem_metric,
            margin=search.margin,
        )
        if chosen is not None:
            return chosen, reverified
    return None


def remeasure(
    searcher: PinSteps,
    references: Sequence[tuple[tuple[optuna.trial.FrozenTrial, TrialRecord] | None, str, bool]],
    reverified: dict[int, list[TrialResult]],
) -> list[list[TrialResult]]:
    """References measured as often as the pin, so a slowdown compares medians of the same
    number of fresh processes; one batch (parallel over the GPUs); a reference whose config
    a candidate shares reuses its re-verification.

    Args:
        references: ((trial, its record) or None, name, check numerics) of each reference.
    """
    trials = searcher.study.get_trials(deepcopy=False)
    out: list[list[TrialResult] | None] = []
    jobs: list[FreshJob] = []
    for found, name, check in references:
        if found is None or not found[1].measured or found[1].spec is None:
            out.append([])
            continue
        trial, spec = found[0], found[1].spec
        shared = [
            results
            for number, results in reverified.items()
            if record_of(trials[number]).spec == spec
        ]
        if shared:
            out.append(list(shared[0]))
            continue
        out.append(None)
        jobs.append(
            FreshJob(
                spec=spec,
                number=trial.number,
                run_name=f"reverify-{name}-{trial.number:04d}",
                phase=f"re-measuring the {name} baseline",
                check=check,
            )
        )
    measured = iter(searcher.fresh_batch(jobs) if jobs else [])
    return [results if results is not None else next(measured) for results in out]


def reference_trial(record: TrialRecord | None, mem_metric: str) -> ReferenceTrial | None:
    """A measured reference's trial as the pin reads it (None: not measured)."""
    if record is None or record.spec is None or record.step_time_ms is None:
        return None
    return ReferenceTrial(
        spec=record.spec,
        peak_bytes=metric_peak(record, mem_metric),
        peak_device_bytes=record.peak_device_bytes,
        step_time_ms=record.step_time_ms,
        peak_phase=record.peak_phase,
    )


def _record(found: tuple[optuna.trial.FrozenTrial, TrialRecord] | None) -> TrialRecord | None:
    return None if found is None else found[1]


def pin_scope(search: SearchSpec) -> PinScope:
    """What the pin records of the search."""
    return PinScope(
        study_name=search.study_name,
        workload=search.workload,
        workload_options=search.workload_options,
        device=search.device,
        limit_bytes=search.max_mem_bytes,
        mem_metric=search.mem_metric,
        margin=search.margin,
        world_size=search.nproc_per_node,
    )


def pin_study(searcher: PinSteps) -> PinDocument:
    """Re-verify, choose, build and record the pin of the searcher's study.

    Raises:
        NothingMeasuredError: no trial could be measured at all (exit 4).
        NoFeasibleConfigError: nothing measured fits, or nothing re-verified does (exit 3).
    """
    search = searcher.search
    trials = searcher.study.get_trials(deepcopy=False)
    candidates = feasible_candidates(trials, search.mem_metric)
    if not candidates:
        unmeasured = nothing_measured_error(searcher)
        raise unmeasured if unmeasured is not None else no_feasible_error(searcher)
    found = reverify_until_one_fits(searcher, candidates)
    if found is None:
        raise no_feasible_error(searcher, after_reverify=True)
    (candidate, results), reverified = found
    unconstrained = baseline_trial(trials, UNCONSTRAINED)
    status = baseline_status(
        trials,
        limit_bytes=search.max_mem_bytes,
        mem_metric=search.mem_metric,
        margin=search.margin,
    )
    full_ac = baseline_trial(trials, FULL_AC) if status != "ok" else None
    if full_ac is not None and full_ac[1].outcome is not TrialOutcome.OK:
        full_ac = None
    measured = unconstrained if status in ("ok", "over_limit") else None
    op_sac = baseline_trial(trials, OP_SAC)
    if op_sac is not None and op_sac[1].outcome is not TrialOutcome.OK:
        op_sac = None
    # the unconstrained baseline is the numerics reference itself: nothing to compare it with
    baseline_runs, full_ac_runs, op_sac_runs = remeasure(
        searcher,
        [(measured, "unconstrained", False), (full_ac, "full-AC", True), (op_sac, "op-SAC", True)],
        reverified,
    )
    metric = search.mem_metric
    pin = build_pin(
        scope=pin_scope(search),
        candidate=candidate,
        reverify_results=results,
        baseline=reference_trial(_record(measured), metric),
        baseline_results=baseline_runs,
        baseline_status=status,
        full_ac=reference_trial(_record(full_ac), metric),
        full_ac_results=full_ac_runs,
        op_sac=reference_trial(_record(op_sac), metric),
        op_sac_results=op_sac_runs,
        trials=len(searcher.study.get_trials(deepcopy=False)),
    )
    reference = pin.reference()
    searcher.store.record_pin(
        study_name=search.study_name,
        pin=pin.to_json_dict(),
        peak_bytes=pin.measured.peak_worst_bytes,
        step_time_ms=pin.measured.step_time_ms,
        slowdown=reference.slowdown if reference is not None else None,
        limit_bytes=search.max_mem_bytes,
        mem_metric=search.mem_metric,
    )
    return pin


def no_feasible_error(
    searcher: PinSteps, *, after_reverify: bool = False
) -> NoFeasibleConfigError:
    """Exit 3's one line: the smallest peak seen and the configuration that gave it."""
    search = searcher.search
    trials = searcher.study.get_trials(deepcopy=False)
    smallest = smallest_peak(trials, search.mem_metric)
    limit = format_bytes(search.max_mem_bytes)
    if smallest is None:  # nothing measured, but some trial ran out of memory
        return NoFeasibleConfigError(
            f"no configuration ran under {limit}: every trial ran out of memory or failed "
            f"(see the logs under {searcher.runs_dir}); raise --max-mem, or use a device "
            "with more memory"
        )
    peak, spec, phase = smallest
    what = "re-verified" if after_reverify else "measured"
    # a trial with wrong numerics does not count whatever the margin
    smallest_ok = smallest_peak(
        (t for t in trials if record_of(t).outcome is TrialOutcome.OK), search.mem_metric
    )
    hint = margin_advice(smallest_ok[0], search) if smallest_ok and not after_reverify else ""
    advice = [a for a in (phase_advice(phase), hint) if a]
    return NoFeasibleConfigError(
        f"no {what} configuration fits under {limit} ({search.mem_metric}) with the "
        f"{format_percent(search.margin)} margin; the smallest peak seen is "
        f"{format_bytes(peak)} from "
        f"{spec.describe()}"
        + "".join(f"; {a}" for a in advice)
        + "; raise --max-mem or run more --trials"
    )


def nothing_measured_error(searcher: PinSteps) -> NothingMeasuredError | None:
    """Exit 4's one line, when no finished trial of the study says whether its configuration
    fits (every one crashed, timed out or had a non-finite loss): it names the first one's
    error and log. None when some trial was measured or ran out of memory (then exit 3)."""
    finished = [
        (trial.number, record, outcome)
        for trial in searcher.study.get_trials(deepcopy=False)
        if (outcome := (record := record_of(trial)).outcome) is not None
    ]
    if any(outcome.tells_fit() for _, _, outcome in finished):
        return None
    name = searcher.search.study_name
    if not finished:
        return NothingMeasuredError(
            f"study {name!r} has no finished trial to pin; run `budgettune search` with "
            "--trials N to measure some"
        )
    counts = Counter(outcome.value for _, _, outcome in finished)
    number, first, outcome = min(finished, key=lambda item: item[0])
    return NothingMeasuredError(
        f"no trial could be measured: {len(finished)} ended "
        + ", ".join(f"{n} {value}" for value, n in sorted(counts.items()))
        + f"; the first, trial {number}, ended {outcome.value}: "
        f"{first.error or 'no error recorded'} "
        f"(log: {first.log_path or searcher.runs_dir}); fix what it says "
        "and run the search again (a larger --max-mem will not help)"
    )


def margin_advice(peak_bytes: int, search: SearchSpec) -> str:
    """Said when the smallest peak is under the limit itself and only the margin keeps it out
    (a limit set at 1.02 x a measured peak, searched with the default 3 % margin)."""
    if search.margin <= 0 or peak_bytes > search.max_mem_bytes:
        return ""
    return (
        f"a configuration measured at {format_bytes(peak_bytes)} is under the limit itself, "
        f"only the {format_percent(search.margin)} margin keeps it out: a lower --margin lets "
        "it count (the pin's worst fresh run must still fit the limit)"
    )
