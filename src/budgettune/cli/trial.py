"""`budgettune workloads` and `budgettune trial`: one configuration, measured once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from budgettune.cli.app import (
    app,
    check_seconds,
    default_device,
    default_run_dir,
    handles_errors,
    parse_options,
    print_error,
    print_json,
    stderr,
    stdout,
)


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
    budget: Annotated[
        float, typer.Option(help="activation_memory_budget, 0 (recompute all) .. 1.")
    ] = 1.0,
    remove_op: Annotated[
        list[str],
        typer.Option("--remove-op", help="aten op taken out of the recomputable list."),
    ] = [],  # noqa: B006
    add_op: Annotated[
        list[str], typer.Option("--add-op", help="aten op put into the recomputable list.")
    ] = [],  # noqa: B006
    solver: Annotated[str, typer.Option(help="Knapsack solver: dp, greedy or ilp.")] = "dp",
    estimator: Annotated[
        str, typer.Option(help="Runtime estimator: flops or profile (CUDA only).")
    ] = "flops",
    mode: Annotated[
        str,
        typer.Option(
            help="eager, default, max-autotune-no-cudagraphs, reduce-overhead or max-autotune."
        ),
    ] = "default",
    backend: Annotated[
        str,
        typer.Option(help="inductor or aot_eager_decomp_partition (no codegen)."),
    ] = "inductor",
    ac_every: Annotated[
        int, typer.Option(help="Checkpoint every k-th repeated block (0 = off).")
    ] = 0,
    ac_policy: Annotated[
        str, typer.Option(help="Block AC policy: full, or op (torchtitan's selective op).")
    ] = "full",
    optimizer_impl: Annotated[
        str, typer.Option(help="as_written, foreach or fused.")
    ] = "as_written",
    alloc_conf: Annotated[
        str,
        typer.Option(help="PYTORCH_CUDA_ALLOC_CONF for the trial, e.g. expandable_segments:True."),
    ] = "",
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda or cuda:N (default: the workload's own).")
    ] = None,
    warmup_steps: Annotated[int, typer.Option(help="Untimed warm-up steps.")] = 2,
    timed_steps: Annotated[int, typer.Option(help="Timed steps (median, p10, p90).")] = 5,
    seed: Annotated[int, typer.Option(help="Seed for the model and the step.")] = 0,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds before the trial is killed; a CPU trial waits at most as long for "
            "the host's CPU-trial lock (another CPU trial), then ends as timeout."
        ),
    ] = 900.0,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            help="Ranks: above 1 the trial is a sharded job (FSDP2) under torchrun.",
        ),
    ] = 1,
    collective_timeout: Annotated[
        float, typer.Option(help="Seconds a rank's collective may wait before it fails.")
    ] = 300.0,
    run_dir: Annotated[
        Path | None, typer.Option(help="Folder for SPEC.json, RESULT.json and trial.log.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Turn the compile caches off for this trial.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the TrialResult JSON only.")
    ] = False,
) -> None:
    """Measure one recompute configuration in a fresh process: real peak memory and step time."""
    from budgettune.trial.devices import check_device_available
    from budgettune.trial.launcher import check_ops_exist, launch_trial
    from budgettune.trial.spec import TrialRun, TrialSpec
    from budgettune.workload import check_reference

    spec = TrialSpec(
        activation_memory_budget=budget,
        recompute_ops_removed=tuple(remove_op),
        recompute_ops_added=tuple(add_op),
        knapsack_solver=solver,
        runtime_estimator=estimator,
        compile_mode=mode,
        compile_backend=backend,
        block_ac_every=ac_every,
        block_ac_policy=ac_policy,
        optimizer_impl=optimizer_impl,
        cuda_alloc_conf=alloc_conf,
        seed=seed,
        warmup_steps=warmup_steps,
        timed_steps=timed_steps,
    )
    check_seconds("--timeout", timeout)
    check_seconds("--collective-timeout", collective_timeout)
    check_reference(workload)
    chosen_device = device or default_device(workload)
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
    check_ops_exist(spec.recompute_ops_removed + spec.recompute_ops_added)
    folder = run_dir or default_run_dir("trial")
    with stderr.status(f"measuring {workload} on {run.device} (log: {folder}/trial.log)"):
        result = launch_trial(run, run_dir=folder, timeout_s=timeout)
    if as_json:
        print_json(result.to_json_dict())
    else:
        from budgettune.present.tables import result_table

        stdout.print(result_table(result))
    if not result.outcome.is_feasible():
        print_error(f"trial {result.outcome.value}: {result.error} (log: {result.log_path})")
        raise typer.Exit(1)
