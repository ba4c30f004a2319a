"""Rich renderables for the CLI: tables and summaries built from results. Builds, never prints."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rich.markup import escape
from rich.table import Table

from budgettune.errors import terminal_safe
from budgettune.pinning.document import PinDocument, PinReference
from budgettune.trial.results import Measurement, TrialResult
from budgettune.trial.spec import TrialSpec
from budgettune.units import format_bytes, format_count


def result_table(
    result: TrialResult, *, title: str = "trial", spec: TrialSpec | None = None
) -> Table:
    """A readable summary of one trial (of ``spec``, when given: what it offloads)."""
    table = Table(title=f"{title}: {result.outcome.value}", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    m = result.measurement
    if m is not None:
        table.add_row("peak device", format_bytes(m.peak_device_bytes))
        table.add_row("peak reserved", format_bytes(m.peak_reserved_bytes))
        table.add_row("peak allocated", format_bytes(m.peak_allocated_bytes))
        table.add_row("steady (params+grads+optim)", format_bytes(m.steady_bytes))
        phases = ", ".join(
            f"{phase} {format_bytes(value)}" for phase, value in m.phase_peak_bytes.items()
        )
        table.add_row("peak set in", f"{m.peak_phase}  ({phases})")
        table.add_row(
            "step time",
            f"{m.step_time_ms:.2f} ms (p10 {m.step_time_p10_ms:.2f}, "
            f"p90 {m.step_time_p90_ms:.2f})",
        )
        if m.forward_backward_ms is not None and m.optimizer_ms is not None:
            passes = m.samples_per_step // max(1, spec.accum_steps) if spec else 0
            table.add_row(
                "accumulated",
                f"{spec.accum_steps if spec else '?'} passes of {m.forward_backward_ms:.2f} ms"
                + (f" ({passes} rows each)" if passes else "")
                + f", then the optimizer step {m.optimizer_ms:.2f} ms",
            )
        if m.samples_per_s is not None:
            table.add_row("samples/s", f"{m.samples_per_s:.1f} ({m.samples_per_step} a step)")
        if m.tokens_per_s is not None:
            table.add_row("tokens/s", f"{m.tokens_per_s:,.0f} ({m.tokens_per_step} a step)")
        table.add_row("compile", f"{m.compile_s:.1f} s")
        table.add_row("first-step loss", f"{m.loss:.6g} (grad norm {m.grad_norm:.6g})")
        if m.offload_bytes or m.host_peak_bytes or (spec is not None and spec.offloads):
            compiled = spec is not None and spec.compiled_offload
            table.add_row(
                "offloaded",
                offload_line(m.offload_bytes, m.host_peak_bytes, compiled_offload=compiled),
            )
    if result.model_changes:
        table.add_row("model changed", ", ".join(result.model_changes))
    if result.world_size > 1:
        table.add_row("world size", f"{result.world_size} ranks (peaks: the largest rank's)")
        for rank in result.ranks:
            table.add_row(f"rank {rank.rank}", rank_line(rank.measurement, rank.error))
    if result.error:
        table.add_row("error", result.error)
    table.add_row("device", f"{result.device_name} (torch {result.torch_version})")
    table.add_row("log", result.log_path)
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    if result.phases_s:
        table.add_row("where it went", phases_line(result.phases_s))
    return table


def samples_line(pin: PinDocument) -> str:
    """Samples per second of a pin with a micro-batch, how its step is made up and, for a
    batch of token ids (its fingerprint's first tensor ``int64[rows, sequence]``), tokens per
    second: ``59.1 (4 a pass x 4 accumulated = 16 a step), 11,347 tokens/s``; "" without a
    micro-batch."""
    spec, step_ms = pin.spec, pin.measured.step_time_ms
    rows = spec.samples_per_step
    if not rows or step_ms <= 0:
        return ""
    line = (
        f"{rows * 1e3 / step_ms:.1f} ({spec.micro_batch} a pass x {spec.accum_steps} "
        f"accumulated = {rows} a step)"
    )
    shapes = pin.fingerprint.workload.get("batch") or [""]
    found = re.fullmatch(r"u?int\d+\[(\d+), (\d+)\]", str(shapes[0]))
    if found:
        tokens = int(found[1]) * int(found[2]) * spec.accum_steps
        line += f", {tokens * 1e3 / step_ms:,.0f} tokens/s"
    return line


def phases_line(phases_s: Mapping[str, float]) -> str:
    """A process's phases in one line, e.g. ``imports 5.1 s, compile 3.9 s, ...``."""
    return ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases_s.items())


def moved_text(offload_bytes: int, compiled_offload: bool) -> str:
    """The bytes a step moved to host memory: the hooks count theirs, the partitioner's
    compiled offload is not counted."""
    if not compiled_offload:
        return format_bytes(offload_bytes)
    if offload_bytes:
        return f"at least {format_bytes(offload_bytes)} (the compiled offload's not counted)"
    return "not counted (the compiled offload)"


def offload_line(offload_bytes: int, host_peak_bytes: int, *, compiled_offload: bool) -> str:
    """What offload moved in a step and held on the host."""
    return (
        f"{moved_text(offload_bytes, compiled_offload)} to host memory and back per step, "
        f"host memory held {format_bytes(host_peak_bytes)} at most"
    )


def rank_line(m: Measurement | None, error: str = "") -> str:
    """One rank's figures on one line."""
    if m is None:
        return error or "no figures"
    return (
        f"peak allocated {format_bytes(m.peak_allocated_bytes)}, device "
        f"{format_bytes(m.peak_device_bytes)}, sharded state {format_bytes(m.steady_bytes)}, "
        f"{m.step_time_ms:.2f} ms"
    )


def pin_table(pin: PinDocument, *, title: str = "pinned config") -> Table:
    """The pinned configuration and its figures."""
    table = Table(title=title, show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    measured = pin.measured
    metric = pin.mem_metric
    table.add_row("config", pin.spec.describe())
    if pin.spec.describe_study():  # the study-wide knobs (the compile backend)
        table.add_row("for the study", pin.spec.describe_study())
    if pin.model_changes:
        table.add_row("model changed", ", ".join(pin.model_changes))
    table.add_row("limit", f"{format_bytes(pin.limit_bytes)} ({metric})")
    if measured.runs == 1:  # one re-measurement: no worst, median or spread to speak of
        fresh = ", with empty compile caches, as on a fresh host" if measured.cold_runs else ""
        peak = f"{format_bytes(measured.peak_worst_bytes)} (1 run{fresh})"
        step = f"{measured.step_time_ms:.2f} ms (1 re-measurement)"
    else:
        cold = (
            f", {measured.cold_runs} of them with empty compile caches, as on a fresh host"
            if measured.cold_runs
            else ""
        )
        peak = (
            f"{format_bytes(measured.peak_worst_bytes)} "
            f"worst of {format_count(measured.runs, 'run')}{cold} "
            f"(median {format_bytes(measured.peak_median_bytes)})"
        )
        step = f"{measured.step_time_ms:.2f} ms (median of re-measurements" + (
            f", {_spread(measured.step_time_range_ms)})"
            if measured.step_time_range_ms is not None and (measured.runs or 0) > 1
            else f", slowest {measured.step_time_worst_ms:.2f} ms)"
            if (measured.runs or 0) > 1
            else ")"
        )
    table.add_row(f"peak {metric}", f"{peak}, set in {measured.peak_phase}")
    table.add_row("step time", step)
    samples = samples_line(pin)
    if samples:  # a micro-batch of the search's (issue 46)
        table.add_row("samples/s", samples)
    table.add_row(
        "fits",
        f"{'peak' if measured.runs == 1 else 'worst peak'} x {1 + pin.margin:.2f} (the margin) "
        f"= {format_bytes(int(measured.peak_worst_bytes * (1 + pin.margin)))}"
        f" <= {format_bytes(pin.limit_bytes)}",
    )
    status = pin.baseline_status
    for reference, label in (
        (pin.baseline, "baseline (budget 1.0)"),
        (pin.full_ac, "full block AC"),
    ):
        if reference is None:
            continue
        over = (
            " (does not fit the limit)"
            if reference is pin.baseline and status == "over_limit"
            else ""
        )
        table.add_row(label, _reference_figures(reference) + over)
        table.add_row(
            f"vs {label}",
            "the pin is this configuration"
            if reference.spec == pin.spec
            else f"{reference.slowdown * 100:+.1f}%",
        )
    op_sac = pin.op_sac
    if op_sac is not None:
        table.add_row(
            "torchtitan op SAC",
            _reference_figures(op_sac) + ("" if op_sac.fits else " (does not fit the limit)"),
        )
        table.add_row("vs op SAC", f"{op_sac.slowdown * 100:+.1f}%")
    if status not in ("ok", "over_limit", "missing"):
        table.add_row("baseline (budget 1.0)", f"cannot run: {escape(terminal_safe(status, 200))}")
    if pin.spec.offloads:
        _offload_rows(table, pin)
    if pin.world_size > 1:
        table.add_row(
            "world size", f"{pin.world_size} ranks; {escape(terminal_safe(pin.sharding, 1000))}"
        )
        for row in measured.per_rank or ():
            table.add_row(
                f"rank {row.rank}",
                f"peak {format_bytes(row.peak_worst_bytes)} (worst), sharded state "
                f"{format_bytes(row.steady_bytes)}, {row.step_time_ms:.2f} ms",
            )
        split = measured.split
        if split is not None:
            table.add_row(
                "per-rank split",
                f"sharded state {format_bytes(split.sharded_state_bytes)} (/ world size) + "
                f"activations {format_bytes(split.activation_bytes)} (not sharded)",
            )
    if pin.advice:
        table.add_row("note", escape(terminal_safe(pin.advice, 4000)))  # a stored pin's text
    table.add_row("study", f"{pin.study_name} (trial {pin.trial_number}, {pin.trials} trials)")
    return table


def _reference_figures(reference: PinReference) -> str:
    """Its peak and step time, with the runs behind the time and their spread."""
    text = f"{format_bytes(reference.peak_bytes)}, {reference.step_time_ms:.2f} ms"
    if not reference.runs:
        return text
    spread = reference.step_time_range_ms
    if spread is not None and reference.runs > 1:
        return f"{text} (median of {format_count(reference.runs, 'run')}, {_spread(spread)})"
    return f"{text} ({_median_of(reference.runs)})"


def _spread(range_ms: tuple[float, float]) -> str:
    return f"{range_ms[0]:.2f}-{range_ms[1]:.2f} ms"


def _median_of(count: int) -> str:
    return "1 run" if count == 1 else f"median of {format_count(count, 'run')}"


def _offload_rows(table: Table, pin: PinDocument) -> None:
    measured = pin.measured
    limit = "" if pin.host_limit_bytes is None else f"; limit {format_bytes(pin.host_limit_bytes)}"
    table.add_row(
        "offloaded",
        offload_line(
            measured.offload_bytes,
            measured.host_peak_worst_bytes,
            compiled_offload=pin.spec.compiled_offload,
        )
        + limit,
    )
    best = pin.no_offload
    if best is None:
        table.add_row("without offload", "nothing without offload fit in this study")
        return
    table.add_row(
        "best without offload",
        f"{best.spec.describe()}: {format_bytes(best.peak_bytes)}, {best.step_time_ms:.2f} ms"
        + (f" ({_median_of(best.runs)})" if best.runs else ""),
    )
    table.add_row("vs best without offload", f"{best.slowdown * 100:+.1f}%")


def study_tables(report) -> list[Table]:  # report: study_report.StudyReport
    """Trials table, best feasible and Pareto front of a study."""
    from rich.text import Text

    metric = report.mem_metric
    with_ac = any(row.slowdown_vs_full_ac is not None for row in report.rows)
    scale, unit = (1e9, "GB") if report.limit_bytes >= 1e9 else (1e6, "MB")

    def size(value: int | None) -> str:
        return "-" if value is None else f"{value / scale:.2f}"

    trials = Table(
        title=f"study {report.study_name}: {report.workload}, limit "
        f"{format_bytes(report.limit_bytes)} ({metric})"
        + (f", {report.study_settings}" if report.study_settings else "")
        + (
            f", host memory for offload {format_bytes(report.host_limit_bytes)}"
            if report.host_limit_bytes is not None
            else ""
        ),
        caption=f"peak: {metric} peak in {unit}; vs base: "
        + ("time per row (samples/s)" if report.ranking_rows else "step time")
        + " against the unconstrained baseline"
        + ("; vs AC: against full block AC (the baseline cannot run)" if with_ac else "")
        + f"; fits: ok and peak x {1 + report.margin:.2f} (the margin) within the limit",
    )
    # Narrow figures, and the rest of the width for the configuration (80-column terminals).
    columns = ["#", "outcome", "fits", f"peak {unit}", "ms", "vs base"]
    sharded = report.world_size > 1
    if sharded:
        trials.caption = (trials.caption or "") + (
            f"; {report.world_size} ranks per trial: peak is the largest rank's, ms the "
            "slowest's; each rank's peak leads the config"
        )
    # Each rank's peak goes into the config cell, which wraps: a column of its own pushed the
    # config out of an 80-column table (seen in the first two-GPU `show`).
    for column in columns + (["vs AC"] if with_ac else []) + ["peak in"]:
        trials.add_column(column, no_wrap=True)
    trials.add_column("config", overflow="fold", ratio=1, min_width=24)

    def percent(value: float | None) -> str:
        return f"{value * 100:+.1f}%" if value is not None else "-"

    for row in report.rows:
        cells = [
            str(row.number),
            row.outcome or row.state.lower(),
            "yes" if row.feasible else "no",
            size(row.peak_bytes),
            f"{row.step_time_ms:.1f}" if row.step_time_ms and row.outcome != "oom" else "-",
            percent(row.slowdown),
        ]
        trials.add_row(
            *cells,
            *([percent(row.slowdown_vs_full_ac)] if with_ac else []),
            {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}.get(row.peak_phase, "-"),
            Text(
                (
                    f"ranks {', '.join(size(p) for p in row.rank_peaks)} {unit}; "
                    if row.rank_peaks
                    else ""
                )
                + (f"[{row.baseline}] " if row.baseline else "")
                + (f"host {size(row.host_peak_bytes)} {unit}; " if row.host_peak_bytes else "")
                + (row.config or row.error)
            ),
        )
    pareto = Table(title="Pareto front (peak vs step time)")
    for column in ("#", f"peak {metric} {unit}", "step ms", "config"):
        pareto.add_column(column, overflow="fold")
    for row in report.pareto:
        pareto.add_row(
            str(row.number), size(row.peak_bytes), f"{row.step_time_ms:.2f}", Text(row.config)
        )
    return [trials, pareto]
