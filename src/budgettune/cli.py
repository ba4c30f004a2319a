"""The `budgettune` command line. The only module that prints or exits.

Each command parses its flags, builds a spec, makes one call and renders the answer. Every
`BudgettuneError` is caught here once: one line on stderr, exit code by kind (``--debug`` shows
the traceback).

Exit codes: 0 ok; 1 other errors (a trial that did not end ``ok``, a storage failure);
2 usage (bad flag, file or reference); 3 no feasible config under the limit.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from budgettune.errors import BudgettuneError, UsageError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 error (or a trial that did not end ok); 2 bad usage or input; "
    "3 no configuration fits under the memory limit."
)

app = typer.Typer(
    name="budgettune",
    help=(
        "Find, by measurement, the activation-recompute configuration of a PyTorch training "
        "step that fits a memory limit with the least slowdown. " + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# No markup parsing in printed strings: error messages and configurations contain brackets
# (`pip install 'budgettune[postgres]'`) that rich would swallow as tags.
stdout = Console(soft_wrap=True, markup=False)
stderr = Console(stderr=True, soft_wrap=True, markup=False)


def print_error(text: str) -> None:
    """``error: TEXT`` on stderr, the prefix in bold red, the text verbatim."""
    stderr.print(Text("error: ", style="bold red") + Text(text), highlight=False)


_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(command: F) -> F:
    """Turn a `BudgettuneError` into one line on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BudgettuneError as exc:
            if _state["debug"]:
                raise
            print_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted; finished work is kept", highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress.")] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else (logging.INFO if verbose else logging.WARNING),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )


def quiet_background() -> None:
    """Keep a long run's stderr to our own lines: progress, trial lines, one error line.

    Optuna's per-trial log lines (and its tracebacks for failed trials) are shown with
    ``--verbose``/``--debug`` only; an exception in a background thread (Optuna's trial
    heartbeat, when the database goes away) is logged, not printed as a traceback: the main
    loop reports the same failure in one line.
    """
    import threading

    import optuna

    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        optuna.logging.set_verbosity(optuna.logging.ERROR)

    def log_thread_error(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "a thread"
        logging.getLogger("budgettune").info("%s stopped: %r", name, args.exc_value)
        if args.exc_value is not None:
            logging.getLogger("budgettune").debug("traceback", exc_info=args.exc_value)

    threading.excepthook = log_thread_error


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["batch_size=8", "dtype=bf16"]`` → ``{"batch_size": 8, "dtype": "bf16"}``."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option {pair!r}: write it as KEY=VALUE, e.g. batch_size=8")
        value: Any = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        options[key.strip()] = value
    return options


def print_json(data: Any) -> None:
    """The machine-readable document, alone on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def default_device(workload: str) -> str:
    """A built-in's own device, else CUDA when NVML sees a GPU, else CPU."""
    from budgettune.launcher import cuda_device_count
    from budgettune.workload import builtin_workload

    if workload.startswith("builtin:"):
        return builtin_workload(workload.split(":", 1)[1]).default_device
    return "cuda" if cuda_device_count() > 0 else "cpu"


def default_run_dir(kind: str) -> Path:
    """``./budgettune-runs/<kind>-<timestamp>``: where trial specs, results and logs go."""
    import datetime

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("budgettune-runs") / f"{kind}-{stamp}"


@app.command()
@handles_errors
def workloads() -> None:
    """List the built-in workloads (use them as --workload builtin:NAME)."""
    from rich.table import Table

    from budgettune.workload import BUILTINS

    table = Table("workload", "device", "what it is")
    for entry in BUILTINS:
        table.add_row(f"builtin:{entry.name}", entry.default_device, entry.description)
    stdout.print(table)


@app.command()
@handles_errors
def trial(
    workload: Annotated[
        str,
        typer.Option(
            "--workload", "-w", help="builtin:NAME, path/to/file.py:fn or pkg.module:fn."
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
    timeout: Annotated[float, typer.Option(help="Seconds before the trial is killed.")] = 900.0,
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
    from budgettune.launcher import check_device_available, check_ops_exist, launch_trial
    from budgettune.spec import TrialRun, TrialSpec
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
    check_reference(workload)
    chosen_device = device or default_device(workload)
    run = TrialRun(
        spec=spec,
        workload=workload,
        workload_options=parse_options(option),
        device=chosen_device,
        cache_root=None if no_cache else str(Path("budgettune-runs/compile-cache").resolve()),
    )
    check_device_available(run.device)
    check_ops_exist(spec.recompute_ops_removed + spec.recompute_ops_added)
    folder = run_dir or default_run_dir("trial")
    with stderr.status(f"measuring {workload} on {run.device} (log: {folder}/trial.log)"):
        result = launch_trial(run, run_dir=folder, timeout_s=timeout)
    if as_json:
        print_json(result.to_json_dict())
    else:
        from budgettune.views import result_table

        stdout.print(result_table(result))
    if not result.outcome.is_feasible():
        print_error(f"trial {result.outcome.value}: {result.error} (log: {result.log_path})")
        raise typer.Exit(1)


def _csv(value: str | None, convert: Callable[[str], Any] = str) -> list[Any] | None:
    if value is None:
        return None
    try:
        return [convert(part.strip()) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{value!r} is not a comma-separated list of numbers") from None


def _budget_range(value: str | None) -> list[float] | None:
    parts = _csv(value, float)
    if parts is not None and len(parts) != 2:
        raise UsageError("--budget-range takes LOW,HIGH, e.g. 0.3,1.0")
    return parts


@app.command()
@handles_errors
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
            "--workload", "-w", help="builtin:NAME, path/to/file.py:fn or pkg.module:fn."
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
    trials: Annotated[
        int | None, typer.Option(help="Trials to add to the study (default 20).")
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (default: from workload, device, limit).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="SQLAlchemy URL or SQLite path (default ./budgettune.db)."),
    ] = None,
    budget_range: Annotated[
        str | None, typer.Option(help="Budgets searched, LOW,HIGH (default 0,1).")
    ] = None,
    modes: Annotated[
        str | None, typer.Option(help="Compile modes searched, comma-separated.")
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="inductor or aot_eager_decomp_partition.")
    ] = None,
    solvers: Annotated[str | None, typer.Option(help="Knapsack solvers searched.")] = None,
    estimators: Annotated[str | None, typer.Option(help="Runtime estimators searched.")] = None,
    ac_every: Annotated[
        str | None, typer.Option(help="Block-AC strides searched, e.g. 0,1,2,4.")
    ] = None,
    ac_policies: Annotated[str | None, typer.Option(help="Block-AC policies: full,op.")] = None,
    optimizer_impls: Annotated[
        str | None, typer.Option(help="Optimizer implementations: as_written,foreach,fused.")
    ] = None,
    alloc_confs: Annotated[
        str | None,
        typer.Option(help="PYTORCH_CUDA_ALLOC_CONF values; use 'default' for unset."),
    ] = None,
    remove_ops: Annotated[
        str | None, typer.Option(help="Ops the search may remove from the recomputable list.")
    ] = None,
    add_ops: Annotated[
        str | None, typer.Option(help="Ops the search may add to the recomputable list.")
    ] = None,
    fix: Annotated[
        list[str] | None,
        typer.Option(help="Hold a dimension at one value, NAME=VALUE (repeatable)."),
    ] = None,
    top_k: Annotated[int | None, typer.Option(help="Configurations re-verified.")] = None,
    reverify: Annotated[
        int | None, typer.Option(help="Fresh re-measurements per configuration.")
    ] = None,
    margin: Annotated[
        float | None, typer.Option(help="Safety margin on the worst re-measured peak.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds before a trial is killed.")
    ] = None,
    warmup_steps: Annotated[int | None, typer.Option(help="Untimed warm-up steps.")] = None,
    timed_steps: Annotated[int | None, typer.Option(help="Timed steps per trial.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed (reproducible search).")] = None,
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
    output: Annotated[
        Path, typer.Option("--output", help="Where to write the pinned config JSON.")
    ] = Path("budgettune-pin.json"),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the pinned config JSON on stdout.")
    ] = False,
) -> None:
    """Search the recompute knobs under --max-mem, re-verify the best, write the pin.

    Re-running the same command resumes the same study. Ctrl-C keeps every finished trial.
    Exit code 3 when nothing fits under the limit.
    """
    from budgettune.pinning import write_pin
    from budgettune.search import run_search
    from budgettune.search_space import parse_fixed
    from budgettune.study_file import build_search_spec, merge, read_study_file

    file_values = read_study_file(study_file) if study_file is not None else {}
    alloc = _csv(alloc_confs)
    gpu_list: list[int] = _csv(gpus, int) or []
    if gpus is not None and not gpu_list:
        raise UsageError("--gpus takes GPU indices, e.g. 0,1,2,3")
    if gpu_list:
        if device is not None and not device.startswith("cuda"):
            raise UsageError(f"--gpus runs on GPUs; drop --device {device}")
        device = f"cuda:{gpu_list[0]}"
    flags = {
        "workload": workload,
        "workload_options": parse_options(option) if option else None,
        "device": device,
        "max_mem": max_mem,
        "mem_metric": mem_metric,
        "trials": trials,
        "study": study,
        "storage": storage,
        "top_k": top_k,
        "reverify": reverify,
        "margin": margin,
        "timeout": timeout,
        "runs_dir": runs_dir,
        "compile_cache": False if no_cache else None,
        "sampler_seed": seed,
        "space": {
            "budget": _budget_range(budget_range),
            "modes": _csv(modes),
            "backend": backend,
            "solvers": _csv(solvers),
            "estimators": _csv(estimators),
            "ac_every": _csv(ac_every, int),
            "ac_policies": _csv(ac_policies),
            "optimizer_impls": _csv(optimizer_impls),
            "alloc_confs": None if alloc is None else ["" if a == "default" else a for a in alloc],
            "remove_ops": _csv(remove_ops),
            "add_ops": _csv(add_ops),
        },
        "fix": parse_fixed(fix) if fix else None,
        "trial": {"warmup_steps": warmup_steps, "timed_steps": timed_steps},
    }
    values = merge(file_values, flags)
    spec = build_search_spec(
        values, default_device=default_device(values.get("workload", "builtin:tiny-gpt"))
    )
    quiet_background()
    with SearchProgress() as progress:
        outcome = run_search(spec, progress, gpus=gpu_list)  # type: ignore[arg-type]
    write_pin(output, outcome.pin)
    if as_json:
        print_json(outcome.pin)
        return
    from budgettune.views import pin_table

    stdout.print(pin_table(outcome.pin))
    stdout.print(
        f"{outcome.trials_run} trials run; study {outcome.study_name!r} in {outcome.storage_url}; "
        f"pinned config written to {output}"
    )


class SearchProgress:
    """A rich progress bar on stderr: trial n/N, best feasible so far, ETA (a SearchObserver).

    It appears once the storage and study are open, so a bad input leaves one line only.
    """

    def __init__(self) -> None:
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
            console=stderr,
            transient=False,
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
        from budgettune.units import format_bytes

        m = event.result.measurement
        figures = (
            f"{format_bytes(m.peak_device_bytes)}, {m.step_time_ms:.1f} ms"
            if m is not None
            else ""
        )
        line = Text(f"trial {event.number}: {event.result.outcome.value} {figures} ")
        line.append(event.spec.describe(), style="dim")
        if event.result.error:
            line.append(f" — {event.result.error}")
        self.progress.console.print(line, highlight=False)
        best = f"{event.best_ms:.2f} ms" if event.best_ms is not None else "-"
        self.progress.update(self.task, completed=event.done, best=best)

    def phase(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=text)

    def trials_finished(self, done: int, best_ms: float | None) -> None:
        best = f"{best_ms:.2f} ms" if best_ms is not None else "-"
        self.progress.update(self.task, completed=done, best=best)


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
        int,
        typer.Option(
            "--heartbeat-s",
            help="Seconds between trial heartbeats; a trial silent for twice this is failed "
            "and retried once by another worker. Use one value for all workers of a study.",
        ),
    ] = 10,
) -> None:
    """Join an existing study and run its trials until the study's trial target is met.

    Start any number of workers, on any hosts that reach the storage (PostgreSQL for more
    than one host); each runs one trial at a time. A worker killed mid-trial has its trial
    failed by heartbeat and re-run once by another worker.
    """
    from budgettune.workers import WorkerJob, run_worker

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


@app.command()
@handles_errors
def dashboard(
    storage: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL or SQLite path (default ./budgettune.db).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")] = 8080,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes",
            help="Let the page change the store (delete studies, tell trials, edit notes and "
            "attrs, upgrade the schema). Without it the dashboard is read-only: every such "
            "request is refused with 403.",
        ),
    ] = False,
) -> None:
    """Serve optuna-dashboard on the study storage, read-only unless --allow-writes.

    Put it behind a reverse proxy (nginx) to share it; it listens on 127.0.0.1 by default.
    """
    from budgettune.dashboard import serve

    serve(
        storage,
        host=host,
        port=port,
        allow_writes=allow_writes,
        log=lambda line: stdout.print(line, highlight=False, markup=False),
    )


@app.command()
@handles_errors
def show(
    study: Annotated[str | None, typer.Option(help="Study name (default: the only one).")] = None,
    storage: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL or SQLite path (default ./budgettune.db).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Show a study: every trial, the best feasible, the Pareto front and the current pin."""
    import dataclasses

    from budgettune.study_report import study_report
    from budgettune.views import pin_table, study_tables

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
    if report.pin is not None:
        stdout.print(pin_table(dict(report.pin), title="current pin"))


@app.command()
@handles_errors
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="Pinned JSON to write.")] = Path(
        "best.json"
    ),
    study: Annotated[str | None, typer.Option(help="Study name (default: the only one).")] = None,
    storage: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL or SQLite path (default ./budgettune.db).")
    ] = None,
) -> None:
    """Write a study's current pinned config to a JSON file a training job loads."""
    from budgettune import storage as storage_mod
    from budgettune.errors import NoFeasibleConfigError
    from budgettune.pinning import parse_pin, write_pin
    from budgettune.study_report import resolve_study_name

    store = storage_mod.open_storage(storage, create=False)
    name = resolve_study_name(store, study)
    pin = store.latest_pin(name)
    if pin is None:
        raise NoFeasibleConfigError(
            f"study {name!r} has no pinned config yet; run `budgettune search --study {name}`"
        )
    parse_pin(dict(pin), source=f"study {name}")
    write_pin(output, pin)
    stdout.print(f"wrote {output}")


@app.command()
@handles_errors
def verify(
    pin_file: Annotated[Path, typer.Argument(help="A pinned config JSON.")],
    runs: Annotated[int, typer.Option(help="Fresh re-measurements.")] = 3,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before a run is killed.")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Re-measure a pinned config; exit 3 if it no longer fits under its limit."""
    from budgettune.verify import verify_pin

    report = verify_pin(
        pin_file,
        runs=runs,
        device=device,
        timeout_s=timeout,
        run_dir=default_run_dir("verify"),
        on_run=lambda i, r: stderr.print(
            f"run {i + 1}/{runs}: {r.outcome.value}", highlight=False
        ),
    )
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


db_app = typer.Typer(help="Database schema commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
@handles_errors
def db_upgrade(
    storage: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL or SQLite path (default ./budgettune.db).")
    ] = None,
) -> None:
    """Upgrade the study database (budgettune's and Optuna's tables) to this version."""
    from budgettune import storage as storage_mod

    before, after = storage_mod.upgrade(storage)
    stdout.print(f"budgettune schema: {before or 'empty'} -> {after}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
