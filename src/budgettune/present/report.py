"""What `budgettune show` reports about a study: its trials, the best feasible, the Pareto front.

Reads Optuna's trials (every measurement is in their user attrs) and our latest pin; builds
frozen rows for the CLI to render.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import StudyNotFoundError, UsageError
from budgettune.pinning import PinDocument, allocator_advice, phase_advice
from budgettune.storage.records import StudyLimit
from budgettune.storage.trials import (
    FULL_AC,
    baseline_status,
    baseline_trial,
    describe_exclusion,
    describe_settlements,
    is_feasible,
    record_of,
    unconstrained_baseline,
)
from budgettune.storage.unreadable import stored_object
from budgettune.storage.user_attrs import (
    EXCLUDED_ATTR,
    SEARCH_ATTR,
    SETTLED_ATTR,
    SPEC_ATTR,
    TrialRecord,
)
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRow:
    """One trial as shown in the table."""

    number: int
    """Optuna trial number."""
    state: str
    """Optuna state (COMPLETE, FAIL, RUNNING...)."""
    outcome: str
    """Our outcome (``ok``, ``oom``, ``non_finite``...; an old ``ok`` with a NaN loss reads
    ``non_finite``), or empty while running."""
    baseline: str
    """Baseline label, or empty."""
    config: str
    """Short description of the spec."""
    peak_bytes: int | None
    """Peak on the study's memory metric."""
    step_time_ms: float | None
    """Median step time."""
    slowdown: float | None
    """Relative to the unconstrained baseline."""
    slowdown_vs_full_ac: float | None = None
    """Relative to full block AC, when the unconstrained baseline cannot run under the limit
    (it ran out of memory, or its peak does not fit): then full AC is the user's alternative."""
    peak_phase: str
    """Where the peak was set."""
    feasible: bool
    """ok and fitting the limit with the margin (the pin's "fits")."""
    peak_allocated_bytes: int | None = None
    """The allocator's allocated peak."""
    peak_reserved_bytes: int | None = None
    """The allocator's reserved peak (fragmentation shows as the gap to allocated)."""
    error: str
    """One-line reason for a failure."""
    rank_peaks: tuple[int | None, ...] = ()
    """Sharded trials: each rank's peak on the study's metric (None: that rank measured
    nothing), by rank; the trial's peak is the largest."""
    rank_step_ms: tuple[float | None, ...] = ()
    """Sharded trials: each rank's median step time; the trial's is the slowest."""
    host_peak_bytes: int | None = None
    """Host memory its offloaded activations held at most (None or 0: no offload)."""
    ranked_ms: float | None = None
    """Its step time as the search ranks it (`TrialSpec.ranked_ms`: per the study's ranking
    rows in a search over micro-batches without a global batch); None: the step time."""

    @property
    def rank_ms(self) -> float | None:
        """What `show` ranks it by: `ranked_ms`, else its step time."""
        return self.step_time_ms if self.ranked_ms is None else self.ranked_ms


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyReport:
    """Everything `show` renders."""

    study_name: str
    """The study."""
    workload: str
    """Its workload reference."""
    limit_bytes: int
    """The memory limit."""
    mem_metric: str
    """The metric the limit applies to."""
    margin: float
    """A trial fits when its peak times (1 + margin) is at most the limit."""
    baseline_status: str
    """The unconstrained baseline: ``ok``, ``over_limit``, its failing outcome, ``missing``."""
    rows: tuple[TrialRow, ...]
    """All trials, by number."""
    best: TrialRow | None
    """Fastest feasible trial."""
    pareto: tuple[TrialRow, ...]
    """Measured ok trials not dominated on (peak, step time), by peak."""
    pin: dict[str, Any] | None
    """The latest pin of the study, its JSON as stored (`pin_document` reads it)."""
    advice: str
    """Said when recompute cannot help (the peak sits in the optimizer step)."""
    excluded: tuple[str, ...] = ()
    """One line per knob value the search stopped proposing after it crashed."""
    settled: tuple[str, ...] = ()
    """One line per free choice the opening held for the rest of the study."""
    world_size: int = 1
    """Ranks per trial (above 1: sharded trials; peaks are per rank)."""
    study_settings: str = ""
    """The study-wide knobs not at their default (`TrialSpec.describe_study`)."""
    host_limit_bytes: int | None = None
    """``--max-host-mem`` of a study that searches offload (None: it does not)."""
    ranking_rows: int = 0
    """The rows step times are scaled to before they are compared (0: as measured)."""

    @property
    def pin_document(self) -> PinDocument | None:
        """The latest pin, typed (None: none, or a stored row that does not read: `pin_error`)."""
        if self.pin is None or self.pin_error is not None:
            return None
        return PinDocument.from_json_dict(self.pin)

    @property
    def pin_error(self) -> str | None:
        """Why the stored pin row cannot be read (None: it reads, or there is none)."""
        from budgettune.errors import PinnedConfigError
        from budgettune.pinning import parse_pin

        if self.pin is None:
            return None
        if _UNREADABLE in self.pin:
            return str(self.pin[_UNREADABLE])
        try:
            parse_pin(self.pin, source="the study's stored pin")
        except PinnedConfigError as exc:
            return str(exc)
        return None


def resolve_study_name(store: storage_mod.Storage, name: str | None) -> str:
    """The given study, or the only one in the storage.

    Raises:
        StudyNotFoundError: unknown name (the known ones are listed), or several and none given.
    """
    names = storage_mod.study_names(store.url)
    if name is not None:
        if name not in names:
            known = ", ".join(names) if names else "none"
            raise StudyNotFoundError(f"no study {name!r} in {store.display_url}; studies: {known}")
        return name
    if len(names) == 1:
        return names[0]
    if not names:
        raise StudyNotFoundError(
            f"no studies in {store.display_url}; run `budgettune search --max-mem SIZE` first"
        )
    raise UsageError(
        f"{len(names)} studies in {store.display_url}; pick one with --study-name: "
        f"{', '.join(names)}"
    )


def pareto_front(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """Rows with no other row at most as high in peak *and* time and better in one."""
    measured = [
        r for r in rows if r.outcome == "ok" and r.peak_bytes is not None and r.rank_ms is not None
    ]
    front = []
    for row in measured:
        dominated = any(
            other.peak_bytes <= row.peak_bytes  # type: ignore[operator]
            and other.rank_ms <= row.rank_ms  # type: ignore[operator]
            and (other.peak_bytes < row.peak_bytes or other.rank_ms < row.rank_ms)  # type: ignore[operator]
            for other in measured
        )
        if not dominated:
            front.append(row)
    return sorted(front, key=lambda r: r.peak_bytes or 0)


def _slowdown(time_ms: float | None, reference_ms: float | None) -> float | None:
    return time_ms / reference_ms - 1.0 if time_ms and reference_ms else None


def _rows(
    trials: Sequence[optuna.trial.FrozenTrial], metric: str, full_ac: bool, rows_to: int = 0
) -> list[TrialRow]:
    def ranked(record: TrialRecord | None) -> float | None:
        if record is None or record.step_time_ms is None or record.spec is None:
            return None if record is None else record.step_time_ms
        return record.spec.ranked_ms(record.step_time_ms, rows_to)

    baseline_ms = ranked(unconstrained_baseline(trials))
    found = baseline_trial(trials, FULL_AC) if full_ac else None
    full_ac_ms = ranked(found[1]) if found and found[1].outcome is TrialOutcome.OK else None
    rows = []
    for t in trials:
        record = record_of(t)
        time_ms = ranked(record)
        rows.append(
            TrialRow(
                number=t.number,
                state=t.state.name,
                outcome=record.outcome_label,
                baseline=record.baseline or "",
                config=record.spec.describe() if record.spec else "",
                peak_bytes=record.peak_bytes(metric),
                step_time_ms=record.step_time_ms,
                ranked_ms=time_ms,
                slowdown=_slowdown(time_ms, baseline_ms),
                slowdown_vs_full_ac=_slowdown(time_ms, full_ac_ms),
                peak_phase=record.peak_phase or "",
                feasible=is_feasible(t),
                error=record.error,
                peak_allocated_bytes=record.peak_allocated_bytes,
                peak_reserved_bytes=record.peak_reserved_bytes,
                rank_peaks=tuple(r.peak_bytes(metric) for r in record.ranks),
                rank_step_ms=tuple(r.step_time_ms for r in record.ranks),
                host_peak_bytes=record.host_peak_bytes,
            )
        )
    return rows


def _host_limit(
    attrs: Mapping[str, Any], trials: Sequence[optuna.trial.FrozenTrial]
) -> int | None:
    """The newest search's ``--max-host-mem``, for a study where some trial offloads."""
    limit = stored_object(attrs, SPEC_ATTR).get("max_host_mem_bytes")
    offloads = any((spec := record_of(t).spec) is not None and spec.offloads for t in trials)
    return int(limit) if limit is not None and offloads else None


_UNREADABLE = "_unreadable_stored_pin"
"""Key of the stand-in for a stored pin row that is not a JSON object (`pin_error` says why)."""


def _stored_pin(store: storage_mod.Storage, name: str) -> dict[str, Any] | None:
    from budgettune.errors import PinnedConfigError

    try:
        value = store.latest_pin(name)
    except PinnedConfigError as exc:  # shown as a note, never a traceback (issue 48)
        return {_UNREADABLE: str(exc)}
    return None if value is None else dict(value)


def study_report(storage_url: str | None, study_name: str | None) -> StudyReport:
    """Read a study into a `StudyReport`.

    Raises:
        StorageError: the storage cannot be used.
        StudyNotFoundError: no such study.
    """
    store = storage_mod.open_storage(storage_url, create=False)
    name = resolve_study_name(store, study_name)
    study = optuna.load_study(study_name=name, storage=store.optuna_storage)
    search = stored_object(study.user_attrs, SEARCH_ATTR)
    study_limit = StudyLimit.of(search)
    metric, limit, margin = study_limit.mem_metric, study_limit.max_mem_bytes, study_limit.margin
    trials = study.get_trials(deepcopy=False)
    status = baseline_status(trials, limit_bytes=limit, mem_metric=metric, margin=margin)
    ranking_rows = int(search.get("ranking_rows", 0) or 0)
    rows = _rows(trials, metric, status != "ok", ranking_rows)
    feasible = [r for r in rows if r.feasible]
    best = min(feasible, key=lambda r: r.rank_ms or math.inf) if feasible else None
    ok_rows = [r for r in rows if r.outcome == "ok"]
    # Recompute cannot go below a peak set in the optimizer step: say so when that is where
    # the lowest-memory configurations sit.
    lowest = min(ok_rows, key=lambda r: r.peak_bytes or 0) if ok_rows else None
    advice = [phase_advice(lowest.peak_phase) if lowest else ""]
    # The allocator's reserve above what was allocated decides whether a config fits: say so
    # where the fastest measured configuration shows a large gap.
    fastest = min(ok_rows, key=lambda r: r.rank_ms or math.inf) if ok_rows else None
    if fastest is not None and fastest.peak_allocated_bytes and fastest.peak_reserved_bytes:
        spec = record_of(next(t for t in trials if t.number == fastest.number)).spec
        advice.append(
            allocator_advice(
                peak_allocated_bytes=fastest.peak_allocated_bytes,
                peak_reserved_bytes=fastest.peak_reserved_bytes,
                mem_metric=metric,
                alloc_conf=spec.cuda_alloc_conf if spec is not None else "",
            )
        )
    return StudyReport(
        study_name=name,
        workload=search.get("workload", ""),
        limit_bytes=limit,
        mem_metric=metric,
        margin=margin,
        baseline_status=status,
        rows=tuple(rows),
        best=best,
        pareto=tuple(pareto_front(rows)),
        pin=_stored_pin(store, name),
        advice="; ".join(a for a in advice if a),
        excluded=tuple(describe_exclusion(e) for e in study.user_attrs.get(EXCLUDED_ATTR, [])),
        settled=describe_settlements(study.user_attrs.get(SETTLED_ATTR)),
        world_size=int(search.get("nproc_per_node", 1)),
        study_settings=TrialSpec.from_json_dict(search.get("base") or {}).describe_study(),
        host_limit_bytes=_host_limit(study.user_attrs, trials),
        ranking_rows=ranking_rows,
    )
