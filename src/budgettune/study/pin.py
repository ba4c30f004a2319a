"""The end of a search: re-verify the fastest fitting trials in fresh processes, pin one.

Re-verification (`budgettune.study.reverify`) walks down the feasible trials, fastest first,
in rounds sized by the noise, until one qualifies (every fresh run ``ok``, the worst peak, a
cold start's included, fits the limit with the margin) or `MAX_CANDIDATES` have been
re-measured. Only when nothing qualifies
does the search end with exit 3 (exit 4 when no trial could be measured at all). The
references the pin reports its slowdown against (the unconstrained baseline, full block AC
when that baseline cannot run under the limit, and torchtitan's op SAC in a sharded study)
are re-measured as often as the pin, and so is, for a pin that offloads, the fastest
configuration without offload that fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import optuna

from budgettune.pinning import (
    Candidate,
    PinDocument,
    PinScope,
    ReferenceTrial,
    build_pin,
)
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
)
from budgettune.study.expressible import keeps
from budgettune.study.fresh import FreshJob
from budgettune.study.pin_errors import (  # noqa: F401 - re-exported
    margin_advice,
    no_feasible_error,
    nothing_measured_error,
)
from budgettune.study.pin_steps import Notices, PinRecorder, PinSteps, StudyTrials  # noqa: F401
from budgettune.study.reverify import (  # noqa: F401 - re-exported
    MAX_CANDIDATES,
    candidate_job,
    first_round_runs,
    noise_of,
    reverify_until_one_fits,
)
from budgettune.study.spec import SearchSpec
from budgettune.trial.results import TrialOutcome, TrialResult


def remeasure(
    searcher: PinSteps,
    references: Sequence[tuple[tuple[optuna.trial.FrozenTrial, TrialRecord] | None, str, bool]],
    reverified: dict[int, list[TrialResult]],
    runs: int,
) -> list[list[TrialResult]]:
    """References measured ``runs`` times, as often as the pin, so a slowdown compares medians
    of the same number of fresh processes; one batch (parallel over the GPUs); a reference
    whose config a candidate shares reuses its re-verification.

    Args:
        references: ((trial, its record) or None, name, check numerics) of each reference.
    """
    trials = searcher.study.get_trials(deepcopy=False)
    out, jobs = _reference_jobs(trials, references, reverified)
    measured = iter(searcher.fresh_batch(jobs, runs=runs) if jobs else [])
    return [results if results is not None else next(measured) for results in out]


def _reference_jobs(
    trials: Sequence[optuna.trial.FrozenTrial],
    references: Sequence[tuple[tuple[optuna.trial.FrozenTrial, TrialRecord] | None, str, bool]],
    reverified: Mapping[int, list[TrialResult]],
) -> tuple[list[list[TrialResult] | None], list[FreshJob]]:
    """Per reference, the runs it shares with a re-verified candidate (or [] when it has no
    measured trial; None: it needs fresh runs), and the jobs of those that need them."""
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
    return out, jobs


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


Found = tuple[optuna.trial.FrozenTrial, TrialRecord] | None
"""A reference's trial and its record (None: the study has no such reference to re-measure)."""


def pin_candidates(
    trials: Sequence[optuna.trial.FrozenTrial], search: SearchSpec
) -> list[Candidate]:
    """The fitting trials, fastest first; with a target, those it can express
    (`expressible.keeps`)."""
    return [
        c
        for c in feasible_candidates(trials, search.mem_metric, search.ranking_rows)
        if keeps(c.spec, search.target)
    ]


def report_references(
    trials: Sequence[optuna.trial.FrozenTrial], search: SearchSpec
) -> tuple[str, list[tuple[Found, str, bool]]]:
    """The unconstrained baseline's status, and the references the pin reports its slowdown
    against as `remeasure` takes them: the unconstrained baseline (where it ran), full block AC
    (where the baseline does not fit) and op SAC, each (trial or None, name, check numerics)."""
    status = baseline_status(
        trials,
        limit_bytes=search.max_mem_bytes,
        mem_metric=search.mem_metric,
        margin=search.margin,
    )
    full_ac = baseline_trial(trials, FULL_AC) if status != "ok" else None
    if full_ac is not None and full_ac[1].outcome is not TrialOutcome.OK:
        full_ac = None
    unconstrained = baseline_trial(trials, UNCONSTRAINED)
    measured = unconstrained if status in ("ok", "over_limit") else None
    op_sac = baseline_trial(trials, OP_SAC)
    if op_sac is not None and op_sac[1].outcome is not TrialOutcome.OK:
        op_sac = None
    # the unconstrained baseline is the numerics reference itself: nothing to compare it with
    return status, [
        (measured, "unconstrained", False),
        (full_ac, "full-AC", True),
        (op_sac, "op-SAC", True),
    ]


def report_alongside(
    trials: Sequence[optuna.trial.FrozenTrial],
    report: Sequence[tuple[Found, str, bool]],
    candidates: Sequence[Candidate],
) -> list[FreshJob]:
    """The report's references that no candidate shares (over the limit): their runs can go
    out with the first round, where the slots hold them (they are re-measured anyway)."""
    numbers = {c.trial_number for c in candidates}
    return [j for j in _reference_jobs(trials, report, {})[1] if j.number not in numbers]


class RoundRun(NamedTuple):
    """One configuration of the first round (`first_round`)."""

    job: FreshJob
    runs: int
    """How many runs the round surely gives it (the first one cold where ``job.cold``)."""


def first_round(
    trials: Sequence[optuna.trial.FrozenTrial], search: SearchSpec, slots: int, running: int = 0
) -> list[RoundRun]:
    """What the re-verification's first round will run, as `reverify_until_one_fits` runs it
    on ``slots`` fresh-run slots, whatever the ``running`` trials still bring: the ``--top-k``
    fastest fitting trials and the fitting references, as many runs each as the round holds,
    a cold first run for each where they all fit the slots at once, else for the fastest;
    then as many of the report's references that no candidate shares, where the round has
    room for them too. A running trial may take a place in the top-k (so only the first
    ``top_k - running`` candidates are sure to stay) and grow the batch by one (fewer runs
    each, less room): what one of them could change is left out, and the counts are the least
    the round can give. Cold is what the round gives if no running trial joins it: one that
    joins can only take cold starts away (a batch past the slots, or a new fastest), so an
    early cold run is at worst a cold run more (counted as one of the round's; on one GPU of
    four slots, slots stood idle for the trials' last 50-62 s of a 380-410 s search,
    `benchmarks/results/h200-new-cold-2026-11-29/`). But where the round, however it turns
    out, leaves a slot free for each running trial, a candidate that one may push out still
    gets its cold first run (one run: at most one slot a running trial wasted, and the round
    holds the rest). In three of four 4-GPU searches of 2026-11-28 the last trial ended 9-24 s
    after the others and was no candidate, and a round's wall is its slowest cold run: waiting
    for it cost that tail.
    `budgettune.study.early_round` runs them on the slots the last trials leave idle; with no
    trial running, this is the round's first batch exactly."""
    candidates = pin_candidates(trials, search)
    if not candidates:
        return []
    top = candidates[: max(1, search.top_k)]
    references = list(fitting_references(trials, candidates).values())
    batch = top + [c for c in references if c not in top]
    low, high = len(batch), len(batch) + running
    runs = first_round_runs(search.reverify_runs, slots, high)
    all_cold = high <= slots  # every first run cold, whatever comes in
    cold = low <= slots  # every first run cold if none of the running trials joins

    def busiest(extra: int) -> int:  # the most slots the round can take, ``extra`` jobs added
        return max((n + extra) * first_round_runs(search.reverify_runs, slots, n)
                   for n in range(low, high + 1))  # fmt: skip

    unsure_ok = all_cold and running > 0 and busiest(0) + running <= slots
    plan, wasted = [], 0  # wasted: the slots runs of pushed-out candidates may hold
    for i, candidate in enumerate(batch):
        # a running trial may push it out of the top-k (a reference stays in the round)
        unsure = search.top_k - running <= i < len(top) and candidate not in references
        if unsure and not unsure_ok:
            continue
        plan.append(RoundRun(candidate_job(candidate, cold=cold or i == 0), 1 if unsure else runs))
        wasted = running if unsure else wasted
    _, report = report_references(trials, search)
    alongside = report_alongside(trials, report, candidates)
    if busiest(len(alongside)) + wasted > slots:
        return plan  # the round may have no room for them: the later rounds take them
    return plan + [RoundRun(job, runs) for job in alongside]


def pin_study(searcher: PinSteps) -> PinDocument:
    """Re-verify, choose, build and record the pin of the searcher's study.

    Raises:
        NothingMeasuredError: no trial could be measured at all (exit 4).
        NoFeasibleConfigError: nothing measured fits, or nothing re-verified does (exit 3).
    """
    search = searcher.search
    trials = searcher.study.get_trials(deepcopy=False)
    candidates = pin_candidates(trials, search)
    if not candidates:
        unmeasured = nothing_measured_error(searcher)
        raise unmeasured if unmeasured is not None else no_feasible_error(searcher)
    references = fitting_references(trials, candidates)
    status, report = report_references(trials, search)
    measured, full_ac, op_sac = (ref for ref, _, _ in report)
    found = reverify_until_one_fits(
        searcher,
        candidates,
        list(references.values()),
        alongside=report_alongside(trials, report, candidates),
    )
    if found is None:
        raise no_feasible_error(searcher, after_reverify=True)
    (candidate, results), reverified = found
    noise = noise_of([c for c in candidates if c.trial_number in reverified], reverified)
    said = noise_notice(noise)
    if said is not None:
        searcher.observer.notice(said)
    pinned_reference = next((n for n, c in references.items() if c == candidate), None)
    if pinned_reference is not None and len(candidates) > 1:
        searcher.observer.notice(
            f"the pin is the {pinned_reference} reference itself (trial "
            f"{candidate.trial_number}): no searched configuration under the limit ran faster "
            f"by more than the noise of the same fresh runs ({noise * 100:.1f} %), and of those "
            "as fast it peaks lowest"
        )
    no_offload = fastest_without_offload(trials, candidates) if candidate.spec.offloads else None
    baseline_runs, full_ac_runs, op_sac_runs, no_offload_runs = remeasure(
        searcher, [*report, (no_offload, "no-offload", True)], reverified, len(results)
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
        no_offload=reference_trial(_record(no_offload), metric),
        no_offload_results=no_offload_runs,
        host_limit_bytes=search.host_limit_bytes,
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


NOISY = 0.10
"""Fresh runs that disagree with their trials or with each other by more than this (10 %) are
said to be noisy: the host is too busy to rank configurations closer than that (issue 45: a
trial of 22.5 ms re-measured at 2476-3001 ms on a busy host, printed without a word)."""


def noise_notice(noise: float) -> str | None:
    """One line when the re-measured runs' noise (`noise_of`) is above `NOISY` (None: it is
    not)."""
    if noise <= NOISY:
        return None
    return (
        f"the fresh runs disagree with their trials or with each other by up to "
        f"{noise * 100:.0f} %: this host is too busy to rank configurations closer than that "
        "(the pin's step times are medians; run on a quiet host or raise --reverify-runs)"
    )


REFERENCE_NAMES = {UNCONSTRAINED: "budget 1.0", FULL_AC: "full block AC", OP_SAC: "op SAC"}
"""The references a pin is compared with, as its output names them."""


def fitting_references(
    trials: Sequence[optuna.trial.FrozenTrial], candidates: Sequence[Candidate]
) -> dict[str, Candidate]:
    """The references (`REFERENCE_NAMES`) that fit, as the candidates that share their
    configuration, by name: re-verified with the top-k, the pin is never one they beat."""
    found: dict[str, Candidate] = {}
    for label, name in REFERENCE_NAMES.items():
        reference = baseline_trial(trials, label)
        if reference is None or reference[1].spec is None:
            continue
        spec = reference[1].spec
        match = next((c for c in candidates if c.spec == spec), None)
        if match is not None and match not in found.values():
            found[name] = match
    return found


def fastest_without_offload(
    trials: Sequence[optuna.trial.FrozenTrial], candidates: Sequence[Candidate]
) -> tuple[optuna.trial.FrozenTrial, TrialRecord] | None:
    """The fastest fitting trial that does not offload (what an offloading pin is compared
    with), or None when every fitting trial offloads."""
    fitting = [c for c in candidates if not c.spec.offloads]
    if not fitting:
        return None
    best = min(fitting, key=lambda c: c.step_time_ms)
    trial = trials[best.trial_number]
    return trial, record_of(trial)
