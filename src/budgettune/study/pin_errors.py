"""The one-line errors of a search that cannot pin: nothing measured (exit 4), nothing fits
(exit 3), with the advice that goes with them."""

from __future__ import annotations

from collections import Counter

from budgettune.errors import NoFeasibleConfigError, NothingMeasuredError
from budgettune.pinning import fits_limit, phase_advice
from budgettune.storage.trials import record_of, smallest_peak
from budgettune.study.pin_steps import PinSteps
from budgettune.study.spec import SearchSpec
from budgettune.trial.results import TrialOutcome
from budgettune.units import format_bytes, format_percent


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
    host_error = _host_limit_error(searcher)
    if host_error is not None and not after_reverify:
        return host_error
    what = "re-verified" if after_reverify else "measured"
    # a trial with wrong numerics does not count whatever the margin
    smallest_ok = smallest_peak(
        (t for t in trials if record_of(t).outcome is TrialOutcome.OK), search.mem_metric
    )
    hint = margin_advice(smallest_ok[0], search) if smallest_ok and not after_reverify else ""
    advice = [a for a in (phase_advice(phase), hint) if a]
    if after_reverify and search.offload_searched:
        advice.append(
            "a configuration that offloads must also keep its host memory within "
            f"--max-host-mem {format_bytes(search.host_limit_bytes)}"
        )
    return NoFeasibleConfigError(
        f"no {what} configuration fits under {limit} ({search.mem_metric}) with the "
        f"{format_percent(search.margin)} margin; the smallest peak seen is "
        f"{format_bytes(peak)} from "
        f"{spec.describe()}"
        + "".join(f"; {a}" for a in advice)
        + "; raise --max-mem or run more --num-trials"
    )


def _host_limit_error(searcher: PinSteps) -> NoFeasibleConfigError | None:
    """Exit 3's line when trials fit the device limit but their offload held more host memory
    than ``--max-host-mem`` (None when no trial was kept out by the host limit alone)."""
    search = searcher.search
    held = []
    for trial in searcher.study.get_trials(deepcopy=False):
        record = record_of(trial)
        peak = record.peak_bytes(search.mem_metric)
        host = record.host_peak_bytes or 0
        if (
            record.outcome is TrialOutcome.OK
            and peak is not None
            and host > search.host_limit_bytes
        ):
            if fits_limit(peak, limit_bytes=search.max_mem_bytes, margin=search.margin):
                held.append(host)
    if not held:
        return None
    return NoFeasibleConfigError(
        f"{len(held)} measured configuration(s) fit under {format_bytes(search.max_mem_bytes)} "
        f"but their offload held more host memory than --max-host-mem "
        f"{format_bytes(search.host_limit_bytes)} (the least: {format_bytes(min(held))}); "
        "raise --max-host-mem, offload fewer blocks, or raise --max-mem"
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
            "--num-trials N to measure some"
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
