"""Where a study's time went: every process it ran (trials, re-verifications, verifies), by
phase (`budgettune.trial.phases.PHASES`), and their totals. `budgettune show --phases`
renders it; `benchmarks/search_phases.py` prints it for a kept study database.

A run stored before phases were recorded has only its wall time and its first step's time:
its first step counts as ``compile`` and the rest of its wall time as ``unsplit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich import box
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
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("run", no_wrap=True, min_width=len(f"{len(rows)} processes"))
    for header in ("wall s", *columns):
        table.add_column(header.replace("_", " "), justify="right", no_wrap=True)
    for row in rows:
        name = row.kind if row.trial_number is None else f"{row.kind} {row.trial_number}"
        if row.outcome != "ok":
            name += f" ({row.outcome})"
        table.add_row(name, _cell(row.wall_s), *(_cell(row.phases_s.get(c)) for c in columns))
    whole = sum(r.wall_s for r in rows)
    kinds = list(dict.fromkeys(r.kind for r in rows))
    for index, kind in enumerate(kinds):
        group = [r for r in rows if r.kind == kind]
        summed = totals(group)
        table.add_row(
            f"{len(group)} {kind}",
            _cell(sum(r.wall_s for r in group)),
            *(_cell(summed.get(c)) for c in columns),
            end_section=index == len(kinds) - 1,
        )
    table.add_row(
        f"{len(rows)} processes", _cell(whole), *(_cell(summed_all.get(c)) for c in columns)
    )
    if whole > 0:
        table.add_row(
            "share", "100%", *(f"{100 * summed_all.get(c, 0.0) / whole:.0f}%" for c in columns)
        )
    return table


def phase_summary(rows: Sequence[PhaseRow], *, title: str) -> Table:
    """Seconds by phase (rows) for each kind of process and for all, with each phase's share
    of the whole: `phase_table` summed, narrow enough for any terminal."""
    kinds = list(dict.fromkeys(r.kind for r in rows))
    by_kind = {kind: totals([r for r in rows if r.kind == kind]) for kind in kinds}
    summed = totals(rows)
    whole = sum(r.wall_s for r in rows)
    table = Table(title=title)
    table.add_column("phase", no_wrap=True)
    for kind in kinds:
        table.add_column(f"{sum(r.kind == kind for r in rows)} {kind} s", justify="right")
    table.add_column(f"{len(rows)} processes s", justify="right")
    table.add_column("share", justify="right")
    for column, seconds in summed.items():
        table.add_row(
            column.replace("_", " "),
            *(_cell(by_kind[kind].get(column)) for kind in kinds),
            _cell(seconds),
            f"{100 * seconds / whole:.0f} %" if whole > 0 else "",
        )
    walls = [_cell(sum(r.wall_s for r in rows if r.kind == kind)) for kind in kinds]
    table.add_section()
    table.add_row("wall", *walls, _cell(whole), "100 %" if whole > 0 else "")
    return table


def _cell(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.0f}" if seconds >= 100 else f"{seconds:.1f}"


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
