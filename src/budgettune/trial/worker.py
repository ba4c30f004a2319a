"""Child entry point: ``python -m budgettune.trial.worker SPEC.json RESULT.json``.

Measures one `TrialRun` in this fresh process and writes ``RESULT.json`` atomically. It never
touches the database or Optuna; its stdout/stderr go to the per-trial log file (the launcher
redirects them), and nothing parses them. Exit code 0 whenever a result was written, whatever
the outcome: the outcome is in the file.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import traceback
from pathlib import Path

from budgettune.trial.results import (
    Measurement,
    TrialOutcome,
    TrialResult,
    write_result_atomically,
)
from budgettune.trial.spec import TrialRun

logger = logging.getLogger("budgettune.trial.worker")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def run_trial(run: TrialRun) -> TrialResult:
    """Measure ``run`` in this process (the caller has prepared the environment).

    Returns:
        A `TrialResult` with outcome ``ok``, ``oom`` (caught by type) or ``crashed``.
    """
    import torch

    from budgettune.errors import BudgettuneError
    from budgettune.trial import measure, recompute
    from budgettune.workload import fingerprint, load_workload

    info = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "device_name": platform.processor() or "cpu",
    }
    try:
        device = torch.device(run.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return TrialResult(
                    outcome=TrialOutcome.CRASHED,
                    error=f"device {run.device} requested but torch sees no CUDA device",
                    **info,  # type: ignore[arg-type]
                )
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
            info["device_name"] = torch.cuda.get_device_name(device)
        else:
            info["device_name"] = f"cpu ({platform.processor() or platform.machine()})"
        torch.manual_seed(run.spec.seed)
        try:
            workload = load_workload(run.workload, device, run.workload_options)
            workload_fingerprint = fingerprint(workload).to_json_dict()
        except torch.cuda.OutOfMemoryError:
            raise  # a model too large for the device is an OOM, not a broken workload
        except Exception as exc:  # noqa: BLE001 - whatever the user's import or build raised
            logger.error("the workload could not be loaded", exc_info=exc)
            error = str(exc) if isinstance(exc, BudgettuneError) else _one_line(exc)[:500]
            return TrialResult(
                outcome=TrialOutcome.CRASHED,
                error=error,
                failed_stage="workload",
                **info,  # type: ignore[arg-type]
            )
        step = recompute.prepare(workload, run.spec, device)
        measurement: Measurement = measure.measure(step, run.spec)
    except torch.cuda.OutOfMemoryError as exc:
        logger.error("out of memory", exc_info=exc)
        return TrialResult(outcome=TrialOutcome.OOM, error=_one_line(exc)[:500], **info)  # type: ignore[arg-type]
    except BudgettuneError as exc:
        # Already one line for the user; the traceback (e.g. the user's build) went to the log.
        logger.error("trial failed: %s", exc)
        return TrialResult(outcome=TrialOutcome.CRASHED, error=str(exc), **info)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - any other failure of user or torch code is a crash
        logger.error("trial crashed", exc_info=exc)
        return TrialResult(outcome=TrialOutcome.CRASHED, error=_one_line(exc)[:500], **info)  # type: ignore[arg-type]
    return TrialResult(
        outcome=TrialOutcome.OK,
        measurement=measurement,
        workload_fingerprint=workload_fingerprint,
        model_changes=step.model_changes,
        **info,  # type: ignore[arg-type]
    )


def main(argv: list[str] | None = None) -> int:
    """Read SPEC.json, prepare the environment before torch loads, measure, write RESULT.json."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m budgettune.trial.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec_path, result_path = Path(args[0]), Path(args[1])
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
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
    # Must happen before torch (and its inductor/CUDA config) is imported.
    from budgettune.trial.recompute import prepare_process_environment

    prepare_process_environment(run)
    logger.info("measuring %s on %s: %s", run.workload, run.device, run.spec.to_json_dict())
    result = run_trial(run)
    logger.info("outcome %s %s", result.outcome.value, result.error)
    write_result_atomically(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
