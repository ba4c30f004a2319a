"""The search's progress display: a rich bar on stderr and one line per finished trial."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from budgettune.cli.app import stderr
from budgettune.errors import terminal_safe
from budgettune.units import format_bytes


class SearchProgress:
    """A rich progress bar on stderr: trial n/N, best feasible so far, ETA (a SearchObserver).

    It appears once the storage and study are open, so a bad input leaves one line only. In a
    notebook without ``ipywidgets`` (rich's live display needs it there) the bar is left out
    and the per-trial lines are the progress.
    """

    def __init__(self, console: Console = stderr) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not live_bar_possible(console),
        )
        self.task: Any = None

    def __enter__(self) -> SearchProgress:
        return self

    def started(self, study_name: str, total: int) -> None:
        self.task = self.progress.add_task(study_name, total=total, best="-")
        self.progress.start()

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.stop()

    def trial_done(self, event: Any) -> None:
        m = event.result.measurement
        # the peak the limit is on: a device peak beside an "allocated" limit read as over it
        metric = event.mem_metric
        figures = (
            f"{format_bytes(m.peak_bytes(metric))}"
            f"{'' if metric == 'device' else ' ' + metric}, {m.step_time_ms:.1f} ms"
            + (f", {m.samples_per_s:.1f} samples/s" if m.samples_per_s is not None else "")
            + (f", {m.tokens_per_s:,.0f} tokens/s" if m.tokens_per_s is not None else "")
            if m is not None
            else ""
        )
        verdict = " (does not fit)" if event.fits is False else ""
        line = Text(f"trial {event.number}: {event.result.outcome.value}{verdict} {figures} ")
        line.append(event.spec.describe(), style="dim")
        if event.result.error:  # it may echo what the user gave: bounded, inert
            line.append(f" — {terminal_safe(event.result.error)}")
        self.progress.console.print(line, highlight=False)
        best = f"{event.best_ms:.2f} ms" if event.best_ms is not None else "-"
        self.progress.update(self.task, completed=event.done, best=best)

    def notice(self, text: str) -> None:
        self.progress.console.print(Text(terminal_safe(text)), highlight=False)

    def phase(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=text)

    def trials_finished(self, done: int, best_ms: float | None) -> None:
        best = f"{best_ms:.2f} ms" if best_ms is not None else "-"
        self.progress.update(self.task, completed=done, best=best)


def live_bar_possible(console: Console) -> bool:
    """Whether rich can draw a live bar on ``console``: anywhere but a notebook that lacks
    ``ipywidgets`` (there rich only warns "install ipywidgets for Jupyter support")."""
    if not console.is_jupyter:
        return True
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None
