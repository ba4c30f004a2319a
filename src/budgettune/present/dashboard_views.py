"""What budgettune pushes into optuna-dashboard: the memory × time scatter and the study note.

Both travel through optuna-dashboard's own Python API as study system attrs: the figure with
`optuna_dashboard.save_plotly_graph_object` under a fixed id (`PLOT_ID`), so a new publish
replaces it, and the note with `optuna_dashboard.save_note`. The search calls
`budgettune.study.publish.publish_views` after each trial batch; the dashboard
(`budgettune.present.dashboard`) only reads them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
import plotly.graph_objects as go

from budgettune.pinning import PinDocument, phase_advice
from budgettune.present.tables import moved_text, samples_line
from budgettune.storage.records import StudyLimit
from budgettune.storage.trials import is_feasible, record_of
from budgettune.trial.results import TrialOutcome
from budgettune.units import format_bytes, format_percent

logger = logging.getLogger(__name__)

PLOT_ID = "budgettune-memory-time"
"""The graph-object id of our scatter: a fixed id makes a new publish replace the old plot."""
FEASIBLE, INFEASIBLE, OOM = "feasible", "infeasible", "oom"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialPoint:
    """One trial as the scatter draws it."""

    number: int
    """Optuna trial number."""
    kind: str
    """``feasible`` (ok, under the limit), ``infeasible`` (measured, over it or wrong
    numerics) or ``oom`` (no figures)."""
    peak_bytes: int | None
    """Peak on the study's memory metric (None for OOM)."""
    step_time_ms: float | None
    """Median step time (None for OOM)."""
    peak_phase: str
    """Where the peak was set, or empty."""
    baseline: str
    """Baseline label (``unconstrained``, ``block-ac-every-1``, ``budget-0.5``) or empty."""
    config: str
    """Short description of the spec."""
    outcome: str
    """Our outcome (``ok``, ``oom``, ``numerics_mismatch``; a stored ``ok`` with a NaN loss
    reads ``non_finite``)."""
    rank_peaks: tuple[int, ...] = ()
    """Sharded trials: each rank's peak on the metric (the point's peak is the largest)."""


def objective_name(rows: int = 0) -> str:
    """What a study's trials are ranked by, as the dashboard names it: the step time, or in a
    study over micro-batches without a global batch the step time scaled to ``rows`` rows
    (`TrialSpec.ranked_ms`: samples per second, issue 46)."""
    return "step time (ms)" if not rows else f"step time per {rows} rows (ms)"


def trial_points(
    trials: Sequence[optuna.trial.FrozenTrial], mem_metric: str, rows: int = 0
) -> list[TrialPoint]:
    """The trials the scatter can place: measured ones and OOMs (crashes and non-finite
    losses have no figures), their step times as the study ranks them (``rows``)."""
    points = []
    for trial in trials:
        record = record_of(trial)
        known = record.outcome
        peak = record.peak_bytes(mem_metric)
        time_ms = record.step_time_ms
        if time_ms is not None and record.spec is not None:
            time_ms = record.spec.ranked_ms(time_ms, rows)
        if known is TrialOutcome.NON_FINITE:
            continue  # no figures to trust (an old database may hold some): counted as failed
        if peak is not None and time_ms is not None:
            kind = FEASIBLE if is_feasible(trial) else INFEASIBLE
        elif known is TrialOutcome.OOM:
            kind, peak, time_ms = OOM, None, None
        else:
            continue
        points.append(
            TrialPoint(
                number=trial.number,
                kind=kind,
                peak_bytes=peak,
                step_time_ms=time_ms,
                peak_phase=record.peak_phase or "",
                baseline=record.baseline or "",
                config=record.spec.describe() if record.spec else "",
                outcome=record.outcome_label,
                rank_peaks=tuple(
                    p for p in (r.peak_bytes(mem_metric) for r in record.ranks) if p is not None
                ),
            )
        )
    return points


def memory_time_figure(
    points: Sequence[TrialPoint],
    *,
    limit_bytes: int,
    mem_metric: str,
    pin: PinDocument | None,
    rows: int = 0,
) -> go.Figure:
    """Peak memory × step time: feasible, infeasible and OOM trials, the limit, the baselines
    labelled and the pinned configuration starred.

    OOM trials have no figures; they are drawn in a row at the top, just past the limit line.
    """
    unit, scale = ("GB", 1e9) if limit_bytes >= 1e9 else ("MB", 1e6)
    measured = [p for p in points if p.kind != OOM]
    top_ms = max((p.step_time_ms or 0.0 for p in measured), default=0.0) * 1.08 or 1.0
    oom_at = (limit_bytes * 1.02 / scale, top_ms)

    def where(point: TrialPoint) -> tuple[float, float]:
        if point.kind == OOM:
            return oom_at
        return (point.peak_bytes or 0) / scale, point.step_time_ms or 0.0

    def hover(point: TrialPoint) -> str:
        head = f"#{point.number}" + (f" [{point.baseline}]" if point.baseline else "")
        if point.kind == OOM:
            return f"{head} OOM<br>{point.config}"
        figures = f"{format_bytes(point.peak_bytes)}, {point.step_time_ms:.2f} ms"
        if point.peak_phase:
            figures += f", peak in {point.peak_phase}"
        if point.outcome != "ok":
            figures += f" ({point.outcome})"
        if point.rank_peaks:
            figures += "<br>per rank: " + ", ".join(format_bytes(b) for b in point.rank_peaks)
        return f"{head} {point.config}<br>{figures}"

    figure = go.Figure()
    styles = {
        FEASIBLE: ("fits", dict(color="#2ca02c", size=9, symbol="circle")),
        INFEASIBLE: ("over the limit", dict(color="#ff7f0e", size=9, symbol="x")),
        OOM: ("OOM (no figures)", dict(color="#d62728", size=11, symbol="x-thin-open")),
    }
    for kind, (name, marker) in styles.items():
        group = [p for p in points if p.kind == kind]
        if not group:
            continue
        xy = [where(p) for p in group]
        figure.add_trace(
            go.Scatter(
                name=f"{name} ({len(group)})",
                x=[x for x, _ in xy],
                y=[y for _, y in xy],
                mode="markers",
                marker=marker,
                hovertext=[hover(p) for p in group],
                hoverinfo="text",
            )
        )
    baselines = [p for p in points if p.baseline]
    if baselines:
        xy = [where(p) for p in baselines]
        figure.add_trace(
            go.Scatter(
                name="baselines",
                x=[x for x, _ in xy],
                y=[y for _, y in xy],
                mode="markers+text",
                marker=dict(color="rgba(0,0,0,0)", size=16, line=dict(color="#555", width=1.5)),
                text=[p.baseline for p in baselines],
                textposition="top center",
                hovertext=[hover(p) for p in baselines],
                hoverinfo="text",
            )
        )
    if pin is not None:
        measured_pin = pin.measured
        figure.add_trace(
            go.Scatter(
                name=f"pinned (trial {pin.trial_number})",
                x=[measured_pin.peak_worst_bytes / scale],
                y=[pin.spec.ranked_ms(measured_pin.step_time_ms, rows)],
                mode="markers+text",
                marker=dict(
                    color="#ffd700", size=22, symbol="star", line=dict(color="#000", width=1)
                ),
                text=[f"pinned #{pin.trial_number}"],
                textposition="bottom center",
                hovertext=[
                    f"pinned: trial {pin.trial_number} {pin.spec.describe()}<br>"
                    f"worst re-measured peak {format_bytes(measured_pin.peak_worst_bytes)}, "
                    f"median {measured_pin.step_time_ms:.2f} ms"
                ],
                hoverinfo="text",
            )
        )
    figure.add_vline(
        x=limit_bytes / scale,
        line=dict(color="#d62728", dash="dash", width=1.5),
        annotation_text=f"--max-mem {limit_bytes / scale:.2f} {unit}",
        annotation_position="bottom left",
    )
    title = f"Peak {mem_metric} memory vs step time"
    if pin is not None:
        title += (
            f"<br><sup>pinned #{pin.trial_number}: "
            f"{format_bytes(pin.measured.peak_worst_bytes)}, "
            f"{pin.measured.step_time_ms:.2f} ms"
        )
        if pin.baseline is not None:
            title += f", {pin.baseline.slowdown * 100:+.1f}% vs unconstrained"
        title += "</sup>"
    grid = dict(gridcolor="#e6e6e6", zeroline=False, showline=True, linecolor="#999")
    # The "none" template keeps the stored JSON small (plotly_white alone is ~6.5 kB).
    figure.update_layout(
        template="none",
        title=dict(text=title, x=0.02, xanchor="left"),
        xaxis=dict(title=dict(text=f"peak {mem_metric} memory ({unit})"), **grid),
        yaxis=dict(title=dict(text=objective_name(rows)), **grid),
        legend=dict(orientation="h", y=-0.2),
        margin=dict(l=60, r=20, t=70, b=60),
        plot_bgcolor="white",
        paper_bgcolor="white",
    )
    return figure


def _batch_rows(pin: PinDocument) -> list[str]:
    """The pin's micro-batch, accumulation and samples per second (issue 46), when it set a
    micro-batch."""
    samples = samples_line(pin)
    return [f"| samples/s | {samples} |"] if samples else []


def _sharded_rows(pin: PinDocument) -> list[str]:
    """The note's rows for torchtitan's op SAC and, when sharded, the world size and ranks."""
    rows = []
    op_sac = pin.op_sac
    if op_sac is not None:
        fits = "" if op_sac.fits else ", does not fit"
        rows.append(
            f"| slowdown vs torchtitan op SAC | {op_sac.slowdown * 100:+.1f}% "
            f"({op_sac.step_time_ms:.2f} ms, peak {format_bytes(op_sac.peak_bytes)}{fits}) |"
        )
    if pin.world_size > 1:
        rows.append(f"| world size | {pin.world_size} ranks, {pin.sharding} |")
        for row in pin.measured.per_rank or ():
            rows.append(
                f"| rank {row.rank} | peak {format_bytes(row.peak_worst_bytes)}, sharded "
                f"state {format_bytes(row.steady_bytes)}, {row.step_time_ms:.2f} ms |"
            )
    return rows


def study_note(
    *,
    study_name: str,
    search: Mapping[str, Any],
    points: Sequence[TrialPoint],
    num_failed: int,
    pin: PinDocument | None,
    optuna_best: int | None = None,
) -> str:
    """The study note (Markdown): the workload and limit, trial counts, and the current pin
    with its peak against the limit, step time, slowdown and the optimizer-phase advice;
    ``optuna_best``: the trial Optuna's own "Best Trial" card shows, said apart from the pin
    where they differ."""
    study_limit = StudyLimit.of(search)
    metric, limit, margin = study_limit.mem_metric, study_limit.max_mem_bytes, study_limit.margin
    counts = {kind: sum(p.kind == kind for p in points) for kind in (FEASIBLE, INFEASIBLE, OOM)}
    lines = [
        f"## budgettune: {markdown_text(study_name)}",
        "",
        f"Workload {code_span(str(search.get('workload', '?')))}, limit "
        f"**{format_bytes(limit)}** on peak "
        f"{metric} memory; a configuration fits when its peak x {1 + margin:.2f} (the "
        f"{format_percent(margin)} margin) is within it. Trials: {counts[FEASIBLE]} fit, "
        f"{counts[INFEASIBLE]} measured over the limit, {counts[OOM]} OOM, {num_failed} "
        "crashed, timed out or had a non-finite loss.",
        "",
    ]
    if pin is not None:
        measured = pin.measured
        peak = measured.peak_worst_bytes
        share = f", {peak / pin.limit_bytes * 100:.1f}% of the limit" if pin.limit_bytes else ""
        baseline = pin.baseline
        status = pin.baseline_status
        if baseline is not None:
            slowdown = (
                f"{baseline.slowdown * 100:+.1f}% ({baseline.step_time_ms:.2f} ms at "
                f"budget 1.0, peak {format_bytes(baseline.peak_bytes)}"
                + (", which does not fit)" if status == "over_limit" else ")")
            )
        elif status not in ("ok", "missing"):
            slowdown = f"none: the unconstrained baseline cannot run ({status})"
        else:
            slowdown = "unknown: the unconstrained baseline was not measured"
        full_ac = pin.full_ac
        vs_full_ac = (
            [
                f"| slowdown vs full block AC | {full_ac.slowdown * 100:+.1f}% "
                f"({full_ac.step_time_ms:.2f} ms, peak {format_bytes(full_ac.peak_bytes)}) |"
            ]
            if full_ac is not None
            else []
        )
        runs = "?" if measured.runs is None else measured.runs
        of = "1 re-measurement" if runs == 1 else f"worst of {runs} re-measurements"
        differs = optuna_best is not None and optuna_best != pin.trial_number
        lines += [
            f"### Current pin: trial {pin.trial_number}",
            "",
            code_span(pin.spec.describe()),
            "",
            *(
                [
                    f"Optuna's own *Best Trial* card shows trial {optuna_best}: the fastest by "
                    "the objective alone, whether or not it fits the limit and before the "
                    f"re-measurements. The pin is trial {pin.trial_number}: the fastest that "
                    "fits, as re-measured in fresh processes.",
                    "",
                ]
                if differs
                else []
            ),
            "| | |",
            "|---|---|",
            f"| peak {pin.mem_metric} ({of}) "
            f"| {format_bytes(peak)}{share}, set in {measured.peak_phase or '?'} |",
            f"| limit | {format_bytes(pin.limit_bytes)} ({pin.mem_metric}) |",
            f"| step time{'' if runs == 1 else ' (median)'} | {measured.step_time_ms:.2f} ms |",
            *_batch_rows(pin),
            f"| slowdown vs unconstrained | {slowdown} |",
            *vs_full_ac,
            *_sharded_rows(pin),
            *_offload_rows(pin),
            "",
        ]
        advice = pin.advice
    else:
        lines += [
            "### No pin yet",
            "",
            "The search pins a configuration once it has re-measured the fastest ones that fit.",
            "",
        ]
        ok = [p for p in points if p.outcome == "ok" and p.peak_bytes is not None]
        lowest = min(ok, key=lambda p: p.peak_bytes or 0) if ok else None
        advice = phase_advice(lowest.peak_phase) if lowest else ""
    if advice:
        lines += [f"> **Advice:** {advice}", ""]
    lines.append(
        "_Written by budgettune after each trial batch; edits made here are replaced. The "
        "memory × time plot is on the study's main page._"
    )
    return "\n".join(lines) + "\n"


def _offload_rows(pin: PinDocument) -> list[str]:
    """A pin that offloads: what a step moves, the host memory held, the best without offload."""
    if not pin.spec.offloads:
        return []
    measured, best = pin.measured, pin.no_offload
    rows = [
        f"| offloaded per step | {moved_text(measured.offload_bytes, pin.spec.compiled_offload)}"
        " to host memory and back |",
        f"| host memory held | {format_bytes(measured.host_peak_worst_bytes)}"
        + (f" (limit {format_bytes(pin.host_limit_bytes)})" if pin.host_limit_bytes else "")
        + " |",
    ]
    if best is None:
        return [*rows, "| slowdown vs best without offload | none fit in this study |"]
    return [
        *rows,
        f"| slowdown vs best without offload | {best.slowdown * 100:+.1f}% "
        f"({best.step_time_ms:.2f} ms, peak {format_bytes(best.peak_bytes)}: "
        f"{markdown_text(best.spec.describe())}) |",
    ]


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|&~])")


def markdown_text(text: str) -> str:
    """``text`` as literal Markdown: every character with a meaning escaped, on one line."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def code_span(text: str) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds (CommonMark: fenced by
    a run of backticks longer than any inside, padded where it starts or ends with one)."""
    flat = " ".join(text.splitlines())  # a blank line would end the span and the paragraph
    fence = "`" * (max((len(run) for run in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"
