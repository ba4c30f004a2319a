"""The trial child: ``python -m budgettune.trial.child SPEC.json RESULT.json``.

Measures one `TrialRun` in this fresh process and writes ``RESULT.json`` atomically. It never
touches the database or Optuna; its stdout/stderr go to the per-trial log file (the launcher
redirects them), and nothing parses them. Exit code 0 whenever a result was written, whatever
the outcome: the outcome is in the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TypedDict

from budgettune.errors import BudgettuneError, NonFiniteLossError, one_line
from budgettune.trial import measure, recompute
from budgettune.trial.accumulation import batch_rows, batch_tokens
from budgettune.trial.cpu_cores import apply_cpu_share
from budgettune.trial.distributed import collective_errors, prepare_sharded, process_group
from budgettune.trial.dropout import active_dropout
from budgettune.trial.environment import prepare_process_environment
from budgettune.trial.gpu_turns import COMPILE_APART_MODES, GpuTurns
from budgettune.trial.phases import PhaseClock, launched_at
from budgettune.trial.results import (
    Measurement,
    TrialOutcome,
    TrialResult,
    write_result_atomically,
)
from budgettune.trial.trial_run import TrialRun
from budgettune.workload import fingerprint, load_workload

logger = logging.getLogger("budgettune.trial.child")  # not __main__ under ``python -m``
ERROR_CHARS = 500
"""An error from torch or the user's code is cut to this many characters in the result."""


class RunInfo(TypedDict):
    """What every result of this process says of where it ran (`TrialResult` fields)."""

    torch_version: str
    cuda_version: str
    device_name: str


def workload_options(run: TrialRun) -> dict[str, Any]:
    """The builder's options: the run's, with ``batch_size`` set to the spec's micro-batch
    when it has one (a builder without that option is refused by `load_workload` in one
    line naming it)."""
    options = dict(run.workload_options)
    if run.spec.micro_batch:
        options["batch_size"] = run.spec.micro_batch
    return options


def _error(exc: BaseException) -> str:
    """The result's one-line error for an exception budgettune did not word itself."""
    return one_line(exc, with_type=True)[:ERROR_CHARS]


def import_compiler(run: TrialRun) -> None:
    """Import torch and, when the spec compiles, its compiler (dynamo, inductor): what every
    trial imports, as one phase (a trial server has them imported already)."""
    import torch

    if run.spec.compile_mode != "eager":
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    del torch


def run_trial(
    run: TrialRun, clock: PhaseClock | None = None, run_dir: Path | None = None
) -> TrialResult:
    """Measure ``run`` in this process (the caller has prepared the environment).

    A run of several ranks (`TrialRun.nproc_per_node`) is one rank of a sharded trial: it
    joins the process group torchrun set up and measures its own figures.

    Args:
        run: what to measure.
        clock: laps each phase (`budgettune.trial.phases`); a new one starting now if None.
        run_dir: the trial's run folder (a shared GPU's trial notes there whom it paused);
            default: the working directory.

    Returns:
        A `TrialResult` with outcome ``ok``, ``oom``, ``non_finite`` (both caught by type) or
        ``crashed``; its ``phases_s`` as far as it got.
    """
    clock = clock or PhaseClock()
    import_compiler(run)
    import torch

    logger.info("torch and its compiler imported in %.1f s", clock.lap("imports"))
    info: RunInfo = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "device_name": platform.processor() or "cpu",
    }
    if run.nproc_per_node > 1:
        result = _run_rank(run, info, clock)
    else:
        folder = run_dir or Path.cwd()
        result = _measure(run, torch.device(run.device), None, info, clock, folder)
    clock.lap("result")
    return result.replace(phases_s=clock.seconds())


def _run_rank(run: TrialRun, info: RunInfo, clock: PhaseClock) -> TrialResult:
    """One rank: join the group, measure, tell a collective broken by a peer from a failure."""
    try:
        with process_group(run) as (device, mesh):
            if device.type == "cuda":
                import torch

                info["device_name"] = torch.cuda.get_device_name(device)
            clock.lap("cuda_init")
            result = _measure(run, device, mesh, info, clock)
            if result.outcome is not TrialOutcome.OK:  # stamped before the group goes away
                result = result.replace(failed_at_s=time.time())
            return result
    except collective_errors() as exc:
        logger.error("a collective failed (another rank gone?)", exc_info=exc)
        return TrialResult(
            outcome=TrialOutcome.CRASHED,
            error=_error(exc),
            failed_stage="collective",
            failed_at_s=time.time(),
            **info,
        )


def _log_compile_caches() -> None:
    """One line of the compile caches' hits, misses and bypasses (why a fresh run of a
    configuration measured before still compiled for long)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - every supported torch has it
        return
    seen = {
        f"{group}.{key}": value
        for group in ("aot_autograd", "inductor")
        for key, value in sorted(counters[group].items())
        if "cache" in key and value
    }
    if seen:
        logger.info("compile caches: %s", ", ".join(f"{k}={v}" for k, v in seen.items()))


def _is_collective_error(exc: BaseException) -> bool:
    return isinstance(exc, collective_errors())


def _measure(
    run: TrialRun,
    device: Any,
    mesh: Any,
    info: RunInfo,
    clock: PhaseClock,
    run_dir: Path | None = None,
) -> TrialResult:
    with contextlib.ExitStack() as leave:
        return _measure_in(run, device, mesh, info, clock, run_dir, leave)


def _join_turns(
    run: TrialRun, device: Any, clock: PhaseClock, run_dir: Path | None, leave: Any
) -> GpuTurns | None:
    """A shared GPU's turns, joined and taken (left when ``leave`` closes); None when the
    trial has its GPU to itself."""
    if not run.shared_gpu:
        return None
    turns = GpuTurns(
        device,
        clock=clock,
        run_dir=run_dir or Path.cwd(),
        compile_apart=run.spec.compile_mode in COMPILE_APART_MODES,
    )
    leave.callback(turns.close)
    turns.take()
    return turns


def _measure_in(
    run: TrialRun,
    device: Any,
    mesh: Any,
    info: RunInfo,
    clock: PhaseClock,
    run_dir: Path | None,
    leave: contextlib.ExitStack,
) -> TrialResult:
    import torch

    turns: GpuTurns | None = None
    try:
        if device.type == "cuda" and mesh is None:
            if not torch.cuda.is_available():
                return TrialResult(
                    outcome=TrialOutcome.CRASHED,
                    error=f"device {run.device} requested but torch sees no CUDA device",
                    **info,
                )
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
            torch.empty(0, device=device)  # the context, here: its cost is its own phase
            info["device_name"] = torch.cuda.get_device_name(device)
            logger.info("CUDA context made in %.1f s", clock.lap("cuda_init"))
            turns = _join_turns(run, device, clock, run_dir, leave)
        elif device.type == "cpu":
            info["device_name"] = f"cpu ({platform.processor() or platform.machine()})"
        torch.manual_seed(run.spec.seed)
        try:
            workload = load_workload(run.workload, device, workload_options(run))
            workload_fingerprint = fingerprint(workload).to_json_dict()
            logger.info("workload built in %.1f s", clock.lap("build"))
        except torch.cuda.OutOfMemoryError:
            raise  # a model too large for the device is an OOM, not a broken workload
        except Exception as exc:  # noqa: BLE001 - whatever the user's import or build raised
            logger.error("the workload could not be loaded", exc_info=exc)
            error = str(exc) if isinstance(exc, BudgettuneError) else _error(exc)
            return TrialResult(
                outcome=TrialOutcome.CRASHED,
                error=error,
                failed_stage="workload",
                **info,
            )
        if mesh is None:
            step = recompute.prepare(workload, run.spec, device)
        else:
            step = prepare_sharded(workload, run.spec, device, mesh)
        logger.info("step prepared in %.1f s", clock.lap("prepare"))
        alone = None if turns is None else turns.alone
        measurement: Measurement = measure.measure(step, run.spec, clock, alone)
        measurement = dataclasses.replace(
            measurement,
            samples_per_step=batch_rows(workload.batch) * run.spec.accum_steps,
            tokens_per_step=batch_tokens(workload.batch) * run.spec.accum_steps,
        )
        logger.info(
            "measured (first step, compile included: %.1f s; other warm-up steps %.1f s; "
            "memory and timed steps %.1f s)",
            measurement.compile_s,
            clock.seconds().get("warmup", 0.0),
            clock.seconds().get("measure", 0.0),
        )
        _log_compile_caches()
    except torch.cuda.OutOfMemoryError as exc:
        logger.error("out of memory", exc_info=exc)
        return TrialResult(outcome=TrialOutcome.OOM, error=_error(exc), **info)
    except NonFiniteLossError as exc:
        logger.error("non-finite first step: %s", exc)
        return TrialResult(
            outcome=TrialOutcome.NON_FINITE,
            error=str(exc),
            workload_fingerprint=workload_fingerprint,
            **info,
        )
    except BudgettuneError as exc:
        # Already one line for the user; the traceback (e.g. the user's build) went to the log.
        logger.error("trial failed: %s", exc)
        return TrialResult(outcome=TrialOutcome.CRASHED, error=str(exc), **info)
    except Exception as exc:  # noqa: BLE001 - any other failure of user or torch code is a crash
        if mesh is not None and _is_collective_error(exc):
            raise  # another rank went away: `_run_rank` says so
        logger.error("trial crashed", exc_info=exc)
        return TrialResult(outcome=TrialOutcome.CRASHED, error=_error(exc), **info)
    return TrialResult(
        outcome=TrialOutcome.OK,
        measurement=measurement,
        workload_fingerprint=workload_fingerprint,
        model_changes=step.model_changes,
        dropout=active_dropout(step.model),
        **info,
    )


def main(argv: list[str] | None = None) -> int:
    """Read SPEC.json, prepare the environment before torch loads, measure, write RESULT.json."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m budgettune.trial.child SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec_path, result_path = Path(args[0]), Path(args[1])
    clock = PhaseClock(launched_at())
    apply_cpu_share()  # before anything starts a thread or a compile worker
    clock.lap("start")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # a trial server's fork: the server's own handlers are not this trial's
    )
    try:
        run = TrialRun.from_json_dict(json.loads(spec_path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        traceback.print_exc()
        write_result_atomically(
            result_path,
            TrialResult(outcome=TrialOutcome.CRASHED, error=f"unreadable {spec_path}: {exc}"),
        )
        return 0
    # before torch (and its inductor/CUDA config) is imported, when this is a fresh process
    cold = prepare_process_environment(run)
    logger.info("measuring %s on %s: %s", run.workload, run.device, run.spec.to_json_dict())
    result = run_trial(run, clock, spec_path.parent).replace(cold_caches=cold)
    logger.info("outcome %s %s", result.outcome.value, result.error)
    write_result_atomically(result_path, result)
    return 0


if __name__ == "__main__":
    code = main()
    # RESULT.json is written: skip the interpreter's teardown (torch's compile-worker pool and
    # CUDA shutting down cost seconds per run: benchmarks/results/README.md#trial-child-exit);
    # the launcher ends what is left of the child's session.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
