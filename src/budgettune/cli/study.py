"""`budgettune show`, `export` and `verify`: read a study, write its pin, re-measure a pin."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from budgettune.cli.app import (
    STORAGE_OPTION,
    STUDY_OPTION,
    app,
    check_count,
    default_run_dir,
    files_read,
    handles_errors,
    print_json,
    stderr,
    stdout,
)
from budgettune.errors import UsageError, shown_path
from budgettune.study.spec import DEFAULT_TRIAL_TIMEOUT_S, MAX_REVERIFY_RUNS, check_seconds


@app.command()
@handles_errors
def show(
    study: Annotated[str | None, STUDY_OPTION] = None,
    storage: Annotated[str | None, STORAGE_OPTION] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    phases: Annotated[
        bool,
        typer.Option(
            "--phases",
            help="Show where the study's time went instead: the seconds its processes (trials, "
            "re-verifications, verifies) spent in each phase (start, imports, CUDA init, build, "
            "prepare, compile, warm-up, GPU wait, measure, result, exit); with --json, every "
            "process's.",
        ),
    ] = False,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Also write the dashboard's picture, peak memory against step time with the "
            "limit, the baselines and the pin, to FILE.html (self-contained) or FILE.png.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace a --plot file that is not a plot budgettune wrote."),
    ] = False,
) -> None:
    """Show a study: every trial, the best feasible, the Pareto front and the current pin."""
    import dataclasses

    from budgettune.present.report import study_report
    from budgettune.present.tables import pin_table, study_tables

    if plot is not None:
        from budgettune.present.plot import check_plot_output, write_plot
        from budgettune.present.report import resolve_study_name
        from budgettune.storage import open_storage
        from budgettune.study.publish import study_views

        # before anything is read or drawn; never the study's database, whatever its name
        target = check_plot_output(plot, protected=files_read(storage), force=force)
        store = open_storage(storage, create=False)
        _, figure, _, _ = study_views(store, resolve_study_name(store, study))
        written = write_plot(figure, target)
        stderr.print(f"wrote {shown_path(str(written))}", highlight=False, markup=False)
    if phases:
        from budgettune.present.phases import phase_summary, study_phases

        name, rows = study_phases(storage, study)
        if as_json:
            print_json({"study_name": name, "runs": [dataclasses.asdict(r) for r in rows]})
        else:
            stdout.print(phase_summary(rows, title=f"where study {name}'s time went"))
            stdout.print("each process's phases: budgettune show --phases --json", highlight=False)
        return

    report = study_report(storage, study)
    if as_json:
        print_json(dataclasses.asdict(report))
        return
    for table in study_tables(report):
        stdout.print(table)
    if report.best is not None:
        stdout.print(f"best feasible: trial {report.best.number}, {report.best.config}")
    else:
        stdout.print("no feasible trial yet")
    if report.advice:
        stdout.print(f"note: {report.advice}")
    for line in report.excluded:
        stdout.print(f"excluded after crashes: {line}", highlight=False)
    for line in report.settled:
        stdout.print(f"held after the opening: {line}", highlight=False)
    if report.pin_error is not None:
        stdout.print(f"note: {report.pin_error}", highlight=False)
    pin = report.pin_document
    if pin is not None:
        stdout.print(pin_table(pin, title="current pin"))


class ExportFormat(str, enum.Enum):
    """What `export` writes."""

    json = "json"
    env = "env"
    torchtitan = "torchtitan"


@app.command()
@handles_errors
def export(
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="Pinned JSON to write, - for stdout (-o is the old spelling, read still: in "
            "search and trial -o is --option).",
        ),
    ] = "budgettune-pin.json",
    study: Annotated[str | None, STUDY_OPTION] = None,
    storage: Annotated[str | None, STORAGE_OPTION] = None,
    output_format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="json: write the pinned JSON to --output. env: print the environment the job "
            "must start with, one KEY=VALUE a line, for a launch script: export $(budgettune "
            "export --format env): BUDGETTUNE_PIN_ALLOC_CONF (the pin's allocator setting, "
            "empty for none; never an empty export) and PYTORCH_CUDA_ALLOC_CONF when it sets one. "
            "torchtitan: print the pin as torchtitan job-config TOML sections "
            "(activation_checkpoint, compile, optimizer); one line on stderr says what "
            "torchtitan's config cannot hold.",
        ),
    ] = ExportFormat.json,
    pin: Annotated[
        Path | None,
        typer.Option(help="Read this pinned JSON instead of the study's current pin."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace an --output file that is not a pin budgettune wrote."
        ),
    ] = False,
) -> None:
    """Write a study's current pinned config to a JSON file a training job loads, or print the
    environment variables the job must start with, or torchtitan's job-config sections."""
    from budgettune.pinning import check_pin_output, load_pinned, parse_pin, write_pin

    if output_format is ExportFormat.json:
        check_pin_output(output, force=force, protected=files_read(storage, pin))
    if pin is not None:
        pinned = load_pinned(pin, warn=False, apply_allocator=False)
        document = dict(pinned.document)
    else:
        document = _study_pin(study, storage)
        # the stored name as its repr: a newline in it must not split the error line (P6-15)
        pinned = parse_pin(document, source=f"study {str(document.get('study_name', ''))!r:.200}")
    if output_format is ExportFormat.env:
        # always one line: a bare `export $(...)` would dump the environment into the job log
        print(f"BUDGETTUNE_PIN_ALLOC_CONF={pinned.spec.cuda_alloc_conf}")
        line = pinned.env_assignment()
        if line:
            print(line)
        return
    if output_format is ExportFormat.torchtitan:
        from budgettune.integrations.torchtitan import torchtitan_config

        config = torchtitan_config(pinned)
        print(config.to_toml(), end="")
        if config.not_expressed:
            stderr.print(
                "note: torchtitan's config cannot hold " + "; ".join(config.not_expressed),
                highlight=False,
            )
        return
    if str(write_pin(output, document)) != "-":  # "-": the pin alone on stdout
        stdout.print(f"wrote {shown_path(str(output))}", highlight=False, markup=False)


def _study_pin(study: str | None, storage: str | None) -> dict[str, object]:
    """The study's current pin, or a `UsageError` saying how to get one (exit 2: a study
    without a pin is not one where nothing fits, issue 48's P6-11)."""
    import json

    from budgettune import storage as storage_mod
    from budgettune.pinning.output import PIN_SIZE_LIMIT
    from budgettune.present.report import resolve_study_name

    store = storage_mod.open_storage(storage, create=False)
    name = resolve_study_name(store, study)
    found = store.latest_pin(name)
    if found is None:
        raise UsageError(
            f"study {name!r} has no pinned config yet; run `budgettune search --study-name {name}`"
        )
    if len(json.dumps(found)) > PIN_SIZE_LIMIT:  # what no reader of a pin file would take
        raise UsageError(
            f"study {name!r}: its stored pin is larger than {PIN_SIZE_LIMIT >> 20} MiB, no pin "
            "budgettune wrote; run the search again to pin anew"
        )
    return dict(found)


@app.command()
@handles_errors
def verify(
    pin_file: Annotated[
        Path | None,
        typer.Argument(
            help="A pinned config JSON (or --pin, as export spells it).", show_default=False
        ),
    ] = None,
    pin_option: Annotated[
        Path | None,
        typer.Option(
            "--pin",
            help="A pinned config JSON (the positional's other spelling).",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            "--reverify-runs",
            "--runs",
            help=f"Fresh re-measurements (1 to {MAX_REVERIFY_RUNS}).",
        ),
    ] = 3,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    timeout: Annotated[
        float,
        typer.Option("--trial-timeout-s", "--timeout", help="Seconds before a run is killed."),
    ] = DEFAULT_TRIAL_TIMEOUT_S,
    allow_other_workload: Annotated[
        bool,
        typer.Option(
            "--allow-other-workload",
            help="Measure on when the workload the pin names is not the one it was measured on "
            "(another fingerprint: parameters, batch shapes, dtypes) or the pin records none; "
            "without it verify stops after the first run (exit 2).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Re-measure a pinned config; exit 3 if it no longer fits under its limit. It first says
    which workload code it will import (the pin names it: check a pin you were handed), and
    refuses (exit 2) a workload file that does not exist or a workload whose fingerprint differs
    from the pinned one."""
    from budgettune.study.verify import verify_pin

    if (pin_file is None) == (pin_option is None):
        raise UsageError("verify takes one pinned config: budgettune verify PIN (or --pin PIN)")
    pin_file = pin_file if pin_file is not None else pin_option
    assert pin_file is not None
    check_count("--reverify-runs", runs, most=MAX_REVERIFY_RUNS)
    check_seconds("--trial-timeout-s", timeout)
    report = verify_pin(
        pin_file,
        runs=runs,
        device=device,
        timeout_s=timeout,
        run_dir=default_run_dir("verify"),
        allow_other_workload=allow_other_workload,
        on_start=lambda line: stderr.print(line, highlight=False),
        on_run=lambda i, r: stderr.print(
            f"run {i + 1}/{runs}: {r.outcome.value}", highlight=False
        ),
    )
    if report.workload_mismatch:
        stderr.print(f"note: not the pinned workload: {report.workload_mismatch}", highlight=False)
    if as_json:
        print_json(report.to_json_dict())
    else:
        from budgettune.units import format_bytes

        stdout.print(
            f"{pin_file}: worst peak {format_bytes(report.worst_peak_bytes)} "
            f"({report.mem_metric}) vs limit {format_bytes(report.limit_bytes)}; "
            f"median step {report.step_time_ms:.2f} ms"
        )
    report.raise_if_over()
