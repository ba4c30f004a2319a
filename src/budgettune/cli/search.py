"""`budgettune search` and `budgettune worker`: run a study's trials, re-verify, pin."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from budgettune.cli.app import (
    STORAGE_OPTION,
    app,
    default_device,
    files_read,
    handles_errors,
    parse_options,
    print_json,
    quiet_background,
    stdout,
)
from budgettune.cli.knob_options import search_parameters, space_values, with_options
from budgettune.cli.progress import SearchProgress
from budgettune.cli.study_options import study_flags, study_parameters
from budgettune.errors import UsageError, shown_path


def _csv(value: str | None, convert: Callable[[str], Any] = str, *, flag: str) -> list[Any] | None:
    if value is None:
        return None
    try:
        return [convert(part.strip()) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a comma-separated list of numbers") from None


def _index(text: str) -> int:
    """A GPU index as the docs write it: ASCII digits only (``１２``, ``1_000`` and ``+3`` were
    read as 12, 1000 and 3: issue 48's P9-10)."""
    digits = text.removeprefix("-")  # a negative one is refused later, as an index
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(text)


@app.command()
@handles_errors
@with_options(search_parameters, into="knobs")
@with_options(study_parameters, into="study", first=True)
def search(
    study_file: Annotated[
        Path | None,
        typer.Argument(help="A TOML study file (studies/*.toml); flags override it."),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option("--option", "-o", help="Workload builder option KEY=VALUE (repeatable)."),
    ] = None,
    fix: Annotated[
        list[str] | None,
        typer.Option(help="Hold a dimension at one value, NAME=VALUE (repeatable)."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="Run one worker process per GPU of this host, e.g. 0,1,2,3 (one trial per GPU "
            "at a time); re-verification runs on the first."
        ),
    ] = None,
    output: Annotated[
        str,
        typer.Option(
            "--output", help="Where to write the pinned config JSON (- for stdout, alone on it)."
        ),
    ] = "budgettune-pin.json",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the pinned config JSON on stdout.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace an --output file that is not a pin budgettune wrote."
        ),
    ] = False,
    study: dict[str, Any] | None = None,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Search the recompute knobs under --max-mem, re-verify the best, write the pin.

    Every study-file key is an option of the same name (``num_trials``: ``--num-trials``);
    flags override the file. Each knob's values to try are an option named as the knob's
    plural (``--knapsack-solvers dp,greedy``); ``--fix NAME=VALUE`` holds one. Re-running
    the same command resumes the same study. Ctrl-C (or SIGTERM) keeps every finished trial;
    the interrupted one runs again next time. Exit code 3 when nothing measured fits under the
    limit, 4 when no trial could be measured at all.
    """
    from budgettune.pinning import check_pin_output, write_pin
    from budgettune.pinning.output import STDOUT
    from budgettune.study.run import run_search
    from budgettune.study.space import parse_fixed
    from budgettune.study.spec import DEFAULT_WORKLOAD
    from budgettune.study.study_file import build_search_spec, merge, read_study_file

    flags = study_flags(study or {})
    read = files_read(flags.get("storage_url"), study_file)
    check_pin_output(output, force=force, protected=read)  # before the search, not after it
    file_values = read_study_file(study_file) if study_file is not None else {}
    gpu_list: list[int] = _csv(gpus, _index, flag="--gpus") or []
    if gpus is not None and not gpu_list:
        raise UsageError("--gpus takes GPU indices, e.g. 0,1,2,3")
    if gpu_list:
        device = flags["device"]
        if device is not None and not device.startswith("cuda"):
            raise UsageError(f"--gpus runs on GPUs; drop --device {device}")
        from budgettune.study.workers import gpu_groups, group_device

        ranks = flags["nproc_per_node"]
        ranks = file_values.get("nproc_per_node", 1) if ranks is None else ranks
        flags["device"] = group_device(gpu_groups(gpu_list, ranks)[0])
    flags["workload_options"] = parse_options(option) if option else None
    flags["space"] = space_values(knobs or {})
    flags["fix"] = parse_fixed(fix) if fix else None
    values = merge(file_values, flags)
    spec = build_search_spec(
        values, default_device=default_device(values.get("workload") or DEFAULT_WORKLOAD)
    )
    read = files_read(spec.storage_url, study_file)
    check_pin_output(output, force=force, protected=read)  # the study file's storage too
    quiet_background()
    started = time.monotonic()
    with SearchProgress() as progress:
        outcome = run_search(spec, progress, gpus=gpu_list)  # type: ignore[arg-type]
    write_pin(output, outcome.pin)  # "-": printed on stdout, alone
    if as_json or str(output) == STDOUT:
        if as_json and str(output) != STDOUT:
            print_json(outcome.pin)
        return
    from budgettune.pinning import PinDocument
    from budgettune.present.tables import pin_table

    stdout.print(pin_table(PinDocument.from_json_dict(outcome.pin)))
    stdout.print(
        f"{outcome.trials_run} trials run and the pin re-verified in "
        f"{time.monotonic() - started:.0f} s; study {outcome.study_name!r} in "
        f"{outcome.storage_url}; pinned config written to {shown_path(str(output))}",
        highlight=False,
        markup=False,
    )


@app.command()
@handles_errors
def worker(
    study: Annotated[
        str,
        typer.Option(
            "--study-name", "--study", help="The study to join (made by `budgettune search`)."
        ),
    ],
    storage: Annotated[str | None, STORAGE_OPTION] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda:N (default: the study's device).")
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            "--max-trials",
            "--trials",
            help="Run at most this many trials (default: until the study's target; a worker "
            "adds none to it: --num-trials of search does).",
        ),
    ] = None,
    runs_dir: Annotated[
        str | None, typer.Option(help="Folder for trial logs and compile caches.")
    ] = None,
    heartbeat_s: Annotated[
        int | None,
        typer.Option(
            "--heartbeat-s",
            help="Check that the study's trial heartbeat is this many seconds (it is set when "
            "the study is created, 10 s, and every worker uses it: a trial silent for twice "
            "that is failed and retried once by another worker). Default: the study's.",
        ),
    ] = None,
) -> None:
    """Join an existing study and run its trials until the study's trial target is met.

    Start any number of workers, on any hosts that reach the storage (PostgreSQL for more
    than one host); each runs one trial at a time. A worker killed mid-trial has its trial
    failed by heartbeat and re-run once by another worker; one stopped by Ctrl-C or SIGTERM
    queues its trial again itself.
    """
    from budgettune.study.workers import WorkerJob, run_worker

    job = WorkerJob(
        study_name=study,
        storage_url=storage,
        device=device,
        max_trials=trials,
        runs_dir=runs_dir,
        heartbeat_interval_s=heartbeat_s,
    )
    quiet_background()
    with SearchProgress() as progress:
        outcome = run_worker(job, progress)  # type: ignore[arg-type]
    stdout.print(
        f"worker on {outcome.device}: {outcome.trials_run} trials run; study "
        f"{outcome.study_name!r} has {outcome.finished}/{outcome.target} trials finished "
        f"in {outcome.storage_url}",
        highlight=False,
    )
