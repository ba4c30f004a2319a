"""Where a study's time went: every process it ran (trials, re-verifications, verifies), by
phase (`budgettune.trial.phases.PHASES`), and their totals. `budgettune show --phases`
renders it; `benchmarks/search_phases.py` prints it for a kept study database.

A run stored before phases were recorded has only its wall time and its first step's time:
its first step counts as ``compile`` and the rest of its wall time as ``unsplit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from budgettune.storage.records import StoredMeasurement
from budgettune.trial.phases import PHASES

UNSPLIT = "unsplit"
"""The column of a run's time that no phase accounts for (runs stored before phases)."""
COLUMNS = (*PHASES, UNSPLIT)


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseRow:
    """One process of a study."""

    kind: str
    """``trial``, ``reverify`` or ``verify``."""
    trial_number: int | None
    """The trial it measured (None: a verify)."""
    outcome: str
    """How it ended."""
    wall_s: float
    """Its wall time, as its launcher saw it."""
    phases_s: Mapping[str, float]
    """Seconds by column of `COLUMNS` (only those it has)."""


def phase_of(run: StoredMeasurement) -> PhaseRow:
    """A stored run as a row: its phases, or for an older run its compile and the rest."""
    phases = dict(run.phases_s)
    if not phases:
        compile_s = run.compile_s if run.compile_s is not None and run.has_measurement else 0.0
        compile_s = min(compile_s, run.wall_s)
        phases = {"compile": compile_s, UNSPLIT: run.wall_s - compile_s}
    return PhaseRow(
        kind=run.kind,
        trial_number=run.trial_number,
        outcome=run.outcome.value,
        wall_s=run.wall_s,
        phases_s=phases,
    )


def totals(rows: Sequence[PhaseRow]) -> dict[str, float]:
    """Seconds by column over ``rows`` (the columns some row has, in `COLUMNS` order)."""
    summed = {column: 0.0 for column in COLUMNS}
    for row in rows:
        for column, seconds in row.phases_s.items():
            summed[column] += seconds
    held = {column for row in rows for column in row.phases_s}
    return {column: summed[column] for column in COLUMNS if column in held}


def phase_table(rows: Sequence[PhaseRow], *, title: str) -> Table:
    """Every process as a row (seconds by phase), then the total of each kind and of all, with
    each column's share of the whole. A phase under 0.05 s in all is left out (the row's wall
    time still counts it), so the table fits a terminal."""
    summed_all = totals(rows)
    columns = [c for c, seconds in summed_all.items() if seconds >= 0.05]
    table = Table(title=title)
    table.add_column("run", no_wrap=True)
    for header in ("wall s", *columns):
        table.add_column(header, justify="right")
    for row in rows:
        name = row.kind if row.trial_number is None else f"{row.kind} {row.trial_number}"
        if row.outcome != "ok":
            name += f" ({row.outcome})"
        table.add_row(name, f"{row.wall_s:.1f}", *(_cell(row.phases_s.get(c)) for c in columns))
    whole = sum(r.wall_s for r in rows)
    kinds = list(dict.fromkeys(r.kind for r in rows))
    for index, kind in enumerate(kinds):
        group = [r for r in rows if r.kind == kind]
        summed = totals(group)
        table.add_row(
            f"{len(group)} {kind}",
            f"{sum(r.wall_s for r in group):.1f}",
            *(_cell(summed.get(c)) for c in columns),
            end_section=index == len(kinds) - 1,
        )
    table.add_row(
        f"{len(rows)} processes", f"{whole:.1f}", *(_cell(summed_all.get(c)) for c in columns)
    )
    if whole > 0:
        table.add_row(
            "share", "100 %", *(f"{100 * summed_all.get(c, 0.0) / whole:.0f} %" for c in columns)
        )
    return table


def _cell(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}"


def study_phases(storage_url: str | None, study_name: str | None) -> tuple[str, list[PhaseRow]]:
    """The study's name and every process it ran, in the order they were stored.

    Raises:
        StorageError: the storage cannot be used.
        StudyNotFoundError: no such study.
    """
    from budgettune import storage as storage_mod
    from budgettune.present.report import resolve_study_name

    store = storage_mod.open_storage(storage_url, create=False)
    try:
        name = resolve_study_name(store, study_name)
        return name, [phase_of(run) for run in store.measurements(name)]
    finally:
        store.close()
