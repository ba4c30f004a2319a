"""A fresh training job that applies a pin with the README's lines and nothing else, then
reports its peak against the pin's (issue 28).

    python benchmarks/pin_in_job.py --pin best.json --output job.json [--order torch-first]
    torchrun --standalone --nproc-per-node 2 benchmarks/pin_in_job.py --pin sharded.json ...

The job builds the pinned workload as the user's own code would (same reference and options),
and then, in this order: ``budgettune.load_pinned(pin)``, the model to the GPU,
``pinned.compile(model)``, ``pinned.optimizer(its optimizer as written)``, and trains: a step
is ``pinned.accum_steps`` forward+backward passes of ``pinned.micro_batch`` rows (the
builder's ``batch_size``, where the pin sets one), then the optimizer step. Nothing else: the
allocator setting, the model changes and the knobs come from those lines alone.
``--order`` says when the pin is loaded: ``pin-first`` (before torch is imported),
``torch-first`` (torch imported, CUDA not started: the README's order) or ``late`` (after the
model is on the GPU: the pin warns that the allocator setting came too late). The third step is
measured with ``pinned.measure_step()`` (the trial measures its third, after two warm-up steps),
then ``--steps`` more are timed. Under torchrun every rank does the same and rank 0 writes all.
Exit 0 when every rank is within ``--tolerance`` of the pin's peak (on the pin's metric), 1 when
one is not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pin", required=True, help="the pinned JSON")
    parser.add_argument("--output", required=True, help="where (rank 0) writes the report")
    parser.add_argument(
        "--order", choices=("pin-first", "torch-first", "late"), default="torch-first"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the measured one")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative, default 1 %%")
    parser.add_argument(
        "--grad-norm-first-step",
        action="store_true",
        help="do what a trial's warm-up does besides training: the first step's global grad "
        "norm (float64 chunks), to tell the trial's recipe from the job's",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    pin_doc = json.loads(Path(args.pin).read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.order == "pin-first":
            import budgettune

            pinned = budgettune.load_pinned(args.pin)
        import torch

        import budgettune
        from budgettune.workload import load_workload

        world = int(os.environ.get("WORLD_SIZE", "1"))
        on_cuda = str(pin_doc.get("device", "cpu")).startswith("cuda")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_cuda else None
        device = device or torch.device("cpu")
        if args.order == "torch-first":
            pinned = budgettune.load_pinned(args.pin)
        if world > 1:  # the job's own process group, as a torchrun training script has
            import datetime

            import torch.distributed as dist

            if on_cuda:
                torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl" if on_cuda else "gloo", timeout=datetime.timedelta(seconds=300)
            )
        torch.manual_seed(0)
        options = dict(pin_doc.get("workload_options") or {})
        if pinned.micro_batch is not None:  # the loader's batch: the pin's micro-batch
            options["batch_size"] = pinned.micro_batch
        workload = load_workload(pin_doc["workload"], device, options)
        if args.order == "late":
            pinned = budgettune.load_pinned(args.pin)
        model = pinned.compile(workload.model, blocks=workload.blocks)
        make = workload.optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-4))
        optimizer = pinned.optimizer(make(model.parameters()))

    def train_step(grad_norm: bool = False) -> None:
        for _ in range(pinned.accum_steps):  # the pin's accumulation, gradients kept
            if workload.autocast_dtype is not None:
                with torch.autocast(device_type=device.type, dtype=workload.autocast_dtype):
                    loss = workload.loss(model, workload.batch)
            else:
                loss = workload.loss(model, workload.batch)
            (loss / pinned.accum_steps).backward()
        if grad_norm:
            from budgettune.trial.measure import global_grad_norm

            float(loss.detach().float().item())
            global_grad_norm(model.parameters())
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step(grad_norm=args.grad_norm_first_step)
    train_step()
    live = {"model": model, "optimizer": optimizer, "batch": workload.batch}
    with pinned.measure_step(device=device, **(live if device.type == "cpu" else {})) as meter:
        train_step()
    times_ms = []
    for _ in range(args.steps):
        if on_cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        train_step()
        if on_cuda:
            torch.cuda.synchronize(device)
        times_ms.append((time.perf_counter() - start) * 1e3)
    check = meter.result
    assert check is not None
    mine: dict[str, Any] = {
        "rank": int(os.environ.get("RANK", "0")),
        **check.to_json_dict(),
        "summary": check.summary(),
        "within_tolerance": check.relative_error is not None
        and abs(check.relative_error) <= args.tolerance,
        "median_step_ms": statistics.median(times_ms) if times_ms else None,
        "model_use_cache": _use_cache(workload.model),
        "warnings": [str(w.message) for w in caught],
    }
    rows = [mine]
    if world > 1:
        import torch.distributed as dist

        rows = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(rows, mine)
        dist.barrier()
        dist.destroy_process_group()
        if mine["rank"] != 0:
            return 0
    measured = pin_doc.get("measured") or {}
    report = {
        "pin": str(args.pin),
        "order": args.order,
        "grad_norm_first_step": args.grad_norm_first_step,
        "world_size": world,
        "spec": pin_doc["spec"],
        "model_changes": pin_doc.get("model_changes"),
        "pinned_device_peak_worst_bytes": measured.get("peak_device_worst_bytes"),
        "tolerance": args.tolerance,
        "ranks": rows,
        "all_within_tolerance": all(row["within_tolerance"] for row in rows),
        "alloc_conf_env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "torch_allocator_settings": _allocator_settings(torch),
        "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "device": torch.cuda.get_device_name(device) if on_cuda else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    for row in rows:
        print(f"{Path(args.pin).name} ({args.order}) rank {row['rank']}: {row['summary']}")
    return 0 if report["all_within_tolerance"] else 1


def _use_cache(model: Any) -> list[bool]:
    from budgettune.trial.hf_cache import transformers_models

    return [bool(m.config.use_cache) for m in transformers_models(model)]


def _allocator_settings(torch: Any) -> str | None:
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return getter() if callable(getter) else None


def _version(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__version__", None)


if __name__ == "__main__":
    code = main()
    if os.environ.get("WORLD_SIZE", "1") != "1":
        # The report is written and the process group destroyed: leave without the
        # interpreter's teardown, as budgettune's own trial ranks do. On torch 2.13's CPU build
        # one rank in some runs aborted (SIGABRT) in that teardown after its work was done
        # (Gloo's worker threads releasing tensors while Python finalises: pytorch/pytorch
        # PR 179291, abandoned), and torchrun then failed the whole job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
