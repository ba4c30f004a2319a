"""`budgettune search` and `budgettune worker`: run a study's trials, re-verify, pin."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from budgettune.cli.app import (
    app,
    default_device,
    handles_errors,
    parse_options,
    print_json,
    quiet_background,
    stdout,
)
from budgettune.cli.knob_options import search_parameters, space_values, with_knob_options
from budgettune.cli.progress import SearchProgress
from budgettune.errors import UsageError
from budgettune.search.spec import SEARCH_DEFAULTS


def _csv(value: str | None, convert: Callable[[str], Any] = str, *, flag: str) -> list[Any] | None:
    if value is None:
        return None
    try:
        return [convert(part.strip()) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a comma-separated list of numbers") from None


@app.command()
@handles_errors
@with_knob_options(search_parameters)
def search(
    study_file: Annotated[
        Path | None,
        typer.Argument(help="A TOML study file (studies/*.toml); flags override it."),
    ] = None,
    max_mem: Annotated[
        str | None,
        typer.Option("--max-mem", help="Memory limit, e.g. 20GB or 18.5GiB (required)."),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            "-w",
            help="builtin:NAME, hf:DIR_OR_TYPE, path/to/file.py:fn or pkg.module:fn.",
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option("--option", "-o", help="Workload builder option KEY=VALUE (repeatable)."),
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    mem_metric: Annotated[
        str | None,
        typer.Option(help="What --max-mem limits: device (nvidia-smi), reserved or allocated."),
    ] = None,
    max_host_mem: Annotated[
        str | None,
        typer.Option(
            "--max-host-mem",
            help="Host memory a trial's offloaded activations may hold, all its ranks together "
            "(--offload-every); a trial over it does not fit. Default: half of this host's "
            "memory.",
        ),
    ] = None,
    num_trials: Annotated[
        int | None,
        typer.Option(
            "--num-trials",
            "--trials",
            help=f"Trials to add to the study (default {SEARCH_DEFAULTS['num_trials']}; a new "
            "study's first ones are budget "
            "1.0, full block AC, budget 0.5, and budget 0.8 from 10 trials on where the budget "
            "range holds it, with fused AdamW and expandable segments where those are "
            "searched; from 8 trials on, full block AC with each of those flipped, the winner "
            "on both memory and time held for the study, then block AC strides per policy "
            "placed by bisection on the memory axis, then each choice left unsettled flipped "
            "at the fastest point that fits); 0 runs none and only re-verifies and "
            "pins what an existing study holds (a search cut off before its pin).",
        ),
    ] = None,
    study_name: Annotated[
        str | None,
        typer.Option(
            "--study-name", "--study", help="Study name (default: from workload, device, limit)."
        ),
    ] = None,
    storage_url: Annotated[
        str | None,
        typer.Option(
            "--storage-url",
            "--storage",
            help="SQLAlchemy URL or SQLite path (default ./budgettune.db).",
        ),
    ] = None,
    fix: Annotated[
        list[str] | None,
        typer.Option(help="Hold a dimension at one value, NAME=VALUE (repeatable)."),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            help="Fastest fitting configurations re-verified together (default "
            f"{SEARCH_DEFAULTS['top_k']}); if none "
            "holds, the next ones are re-verified one by one, up to 8 in all, before exit 3."
        ),
    ] = None,
    reverify_runs: Annotated[
        int | None,
        typer.Option(
            "--reverify-runs", "--reverify", help="Fresh re-measurements per configuration."
        ),
    ] = None,
    margin: Annotated[
        float | None,
        typer.Option(
            help="Safety margin: a configuration fits when its peak x (1 + margin) is within "
            "--max-mem, for the search, the re-verification and the pin alike. It absorbs "
            "run-to-run variation of the peak; 0.01-0.05 is sensible (default "
            f"{SEARCH_DEFAULTS['margin']})."
        ),
    ] = None,
    trial_timeout_s: Annotated[
        float | None,
        typer.Option("--trial-timeout-s", "--timeout", help="Seconds before a trial is killed."),
    ] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="Untimed warm-up steps.")] = None,
    timed_steps: Annotated[int | None, typer.Option(help="Timed steps per trial.")] = None,
    sampler_seed: Annotated[
        int | None,
        typer.Option("--sampler-seed", "--seed", help="Sampler seed (reproducible search)."),
    ] = None,
    runs_dir: Annotated[
        str | None, typer.Option(help="Folder for trial logs and compile caches.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Compile every trial from scratch.")
    ] = False,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="Run one worker process per GPU of this host, e.g. 0,1,2,3 (one trial per GPU "
            "at a time); re-verification runs on the first."
        ),
    ] = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node",
            help="Ranks per trial: above 1 each trial is a sharded job (FSDP2, torchtitan "
            "order) under torchrun; with --gpus, each group of N GPUs runs one trial.",
        ),
    ] = None,
    collective_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--collective-timeout-s",
            "--collective-timeout",
            help="Seconds a rank's collective may wait before it fails (default "
            f"{SEARCH_DEFAULTS['collective_timeout_s']:g}).",
        ),
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", help="Where to write the pinned config JSON.")
    ] = Path("budgettune-pin.json"),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the pinned config JSON on stdout.")
    ] = False,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Search the recompute knobs under --max-mem, re-verify the best, write the pin.

    Each knob's values to try are an option named as the knob's plural
    (``--knapsack-solvers dp,greedy``); ``--fix NAME=VALUE`` holds one. Re-running the same
    command resumes the same study. Ctrl-C (or SIGTERM) keeps every
    finished trial; the interrupted one runs again next time. Exit code 3 when nothing
    measured fits under the limit, 4 when no trial could be measured at all.
    """
    from budgettune.pinning import check_pin_output, write_pin
    from budgettune.search.run import run_search
    from budgettune.search.space import parse_fixed
    from budgettune.search.spec import DEFAULT_WORKLOAD
    from budgettune.search.study_file import build_search_spec, merge, read_study_file

    check_pin_output(output)  # before the search, not after it
    file_values = read_study_file(study_file) if study_file is not None else {}
    gpu_list: list[int] = _csv(gpus, int, flag="--gpus") or []
    if gpus is not None and not gpu_list:
        raise UsageError("--gpus takes GPU indices, e.g. 0,1,2,3")
    if gpu_list:
        if device is not None and not device.startswith("cuda"):
            raise UsageError(f"--gpus runs on GPUs; drop --device {device}")
        from budgettune.search.workers import gpu_groups, group_device

        ranks = file_values.get("nproc_per_node", 1) if nproc_per_node is None else nproc_per_node
        device = group_device(gpu_groups(gpu_list, ranks)[0])
    flags = {
        "workload": workload,
        "workload_options": parse_options(option) if option else None,
        "device": device,
        "max_mem": max_mem,
        "max_host_mem": max_host_mem,
        "mem_metric": mem_metric,
        "num_trials": num_trials,
        "study_name": study_name,
        "storage_url": storage_url,
        "top_k": top_k,
        "reverify_runs": reverify_runs,
        "margin": margin,
        "trial_timeout_s": trial_timeout_s,
        "runs_dir": runs_dir,
        "compile_cache": False if no_cache else None,
        "sampler_seed": sampler_seed,
        "nproc_per_node": nproc_per_node,
        "collective_timeout_s": collective_timeout_s,
        "space": space_values(knobs or {}),
        "fix": parse_fixed(fix) if fix else None,
        "trial": {"warmup_steps": warmup_steps, "timed_steps": timed_steps},
    }
    values = merge(file_values, flags)
    spec = build_search_spec(
        values, default_device=default_device(values.get("workload") or DEFAULT_WORKLOAD)
    )
    quiet_background()
    started = time.monotonic()
    with SearchProgress() as progress:
        outcome = run_search(spec, progress, gpus=gpu_list)  # type: ignore[arg-type]
    write_pin(output, outcome.pin)
    if as_json:
        print_json(outcome.pin)
        return
    from budgettune.pinning import PinDocument
    from budgettune.present.tables import pin_table

    stdout.print(pin_table(PinDocument.from_json_dict(outcome.pin)))
    stdout.print(
        f"{outcome.trials_run} trials run and the pin re-verified in "
        f"{time.monotonic() - started:.0f} s; study {outcome.study_name!r} in "
        f"{outcome.storage_url}; pinned config written to {output}"
    )


@app.command()
@handles_errors
def worker(
    study: Annotated[str, typer.Option(help="The study to join (made by `budgettune search`).")],
    storage: Annotated[
        str | None,
        typer.Option(
            envvar="BUDGETTUNE_STORAGE",
            help="SQLAlchemy URL or SQLite path (default ./budgettune.db).",
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda:N (default: the study's device).")
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(help="Run at most this many trials (default: until the study's target)."),
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
    from budgettune.search.workers import WorkerJob, run_worker

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
