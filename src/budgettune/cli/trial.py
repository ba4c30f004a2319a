"""`budgettune workloads` and `budgettune trial`: one configuration, measured once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from budgettune.cli.app import (
    app,
    default_device,
    default_run_dir,
    handles_errors,
    parse_options,
    print_error,
    print_json,
    stderr,
    stdout,
)
from budgettune.cli.knob_options import spec_values, trial_parameters, with_options
from budgettune.errors import UsageError
from budgettune.study.spec import DEFAULT_TRIAL_TIMEOUT_S, check_seconds
from budgettune.trial.trial_run import DEFAULT_COLLECTIVE_TIMEOUT_S


@app.command()
@handles_errors
def workloads() -> None:
    """List the built-in workloads (use them as --workload builtin:NAME)."""
    from rich.table import Table

    from budgettune.workload import BUILTINS

    table = Table("workload", "device", "what it is")
    for entry in BUILTINS:
        table.add_row(f"builtin:{entry.name}", entry.default_device, entry.description)
    table.add_row(
        "hf:DIR_OR_TYPE",
        "cuda/cpu",
        "a transformers model from a folder's config.json, a model type (gpt2, llama, ...) "
        "or a Hub id's config.json (hf:ORG/NAME), random weights, -o KEY=VALUE config "
        "overrides (pip install 'budgettune[hf]')",
    )
    stdout.print(table)


@app.command()
@handles_errors
@with_options(trial_parameters)
def trial(
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            "-w",
            help="builtin:NAME, hf:DIR_OR_TYPE, path/to/file.py:fn or pkg.module:fn.",
        ),
    ] = "builtin:tiny-gpt",
    option: Annotated[
        list[str],
        typer.Option("--option", "-o", help="Workload builder option KEY=VALUE (repeatable)."),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda or cuda:N (default: the workload's own).")
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--trial-timeout-s",
            "--timeout",
            help="Seconds before the trial is killed; a CPU trial waits at most as long for "
            "the host's CPU-trial lock (another CPU trial), then ends as timeout.",
        ),
    ] = DEFAULT_TRIAL_TIMEOUT_S,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            help="Ranks: above 1 the trial is a sharded job (FSDP2) under torchrun.",
        ),
    ] = 1,
    collective_timeout: Annotated[
        float,
        typer.Option(
            "--collective-timeout-s",
            "--collective-timeout",
            help="Seconds a rank's collective may wait before it fails.",
        ),
    ] = DEFAULT_COLLECTIVE_TIMEOUT_S,
    run_dir: Annotated[
        Path | None, typer.Option(help="Folder for SPEC.json, RESULT.json and trial.log.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Turn the compile caches off for this trial.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the TrialResult JSON only.")
    ] = False,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Measure one recompute configuration in a fresh process: real peak memory and step time.

    Each knob is an option named as the knob (``--knapsack-solver greedy``); a knob not given
    is at its default.
    """
    from budgettune.trial.devices import check_device_available
    from budgettune.trial.launcher import check_ops_exist, launch_trial
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun
    from budgettune.workload import check_reference

    spec = TrialSpec(**spec_values(knobs or {}))
    check_seconds("--trial-timeout-s", timeout)
    check_seconds("--collective-timeout-s", collective_timeout)
    check_reference(workload, parse_options(option))
    chosen_device = default_device(workload) if device is None else device
    run = TrialRun(
        spec=spec,
        workload=workload,
        workload_options=parse_options(option),
        device=chosen_device,
        cache_root=None if no_cache else str(Path("budgettune-runs/compile-cache").resolve()),
        nproc_per_node=nproc_per_node,
        collective_timeout_s=collective_timeout,
    )
    check_device_available(run.device)
    if spec.is_compiled and spec.runtime_estimator == "profile" and run.device == "cpu":
        raise UsageError(  # the child refused it after starting (issue 48)
            "--runtime-estimator profile benchmarks ops on a GPU and needs CUDA; on --device "
            "cpu use flops"
        )
    check_ops_exist(
        spec.recompute_ops_removed + spec.recompute_ops_added,
        compiled_offload=spec.compiled_offload,
    )
    if run_dir is not None and str(run_dir) in ("", "."):  # "" is "." to typer (P9-7)
        raise UsageError(
            "--run-dir: name a folder of the trial's own for SPEC.json, RESULT.json and "
            "trial.log, not the current one"
        )
    folder = run_dir or default_run_dir("trial")
    with stderr.status(f"measuring {workload} on {run.device} (log: {folder}/trial.log)"):
        result = launch_trial(run, run_dir=folder, timeout_s=timeout)
    if as_json:
        print_json(result.to_json_dict())
    else:
        from budgettune.present.tables import result_table

        stdout.print(result_table(result, spec=spec))
    if not result.outcome.is_feasible():
        print_error(f"trial {result.outcome.value}: {result.error} (log: {result.log_path})")
        raise typer.Exit(1)
