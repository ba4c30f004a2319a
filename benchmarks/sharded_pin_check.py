"""Apply a sharded pin in a torchrun training job and compare each rank's peak with the pin's.

    torchrun --standalone --nproc-per-node 2 benchmarks/sharded_pin_check.py \\
        --pin pin.json --output check.json

Every rank builds the pinned workload (same reference and options as the study), applies the
pin with ``budgettune.load_pinned(...).compile(model)`` (block AC, per-block compile, FSDP2 in
torchtitan's order, under the process group torchrun set up) and its optimizer implementation,
then trains: warm-up steps, one memory-measured step, timed steps (budgettune's own recipe, so
the figures are taken as the trial's were). Rank 0 writes, per rank, the peak allocated bytes
against the pin's ``measured.per_rank`` and whether it is within ``--tolerance`` (2 %).
Exit code 0 when every rank is within it, 1 when one is not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pin", required=True, help="the pinned JSON of a sharded study")
    parser.add_argument("--output", required=True, help="where rank 0 writes the check JSON")
    parser.add_argument("--tolerance", type=float, default=0.02, help="relative, default 2 %%")
    parser.add_argument("--timed-steps", type=int, default=None, help="default: the pin's")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run on every rank; rank 0 writes the JSON."""
    args = _arguments(argv)
    pin_doc = json.loads(Path(args.pin).read_text())
    alloc_conf = pin_doc.get("spec", {}).get("cuda_alloc_conf")
    if alloc_conf:  # read once, when CUDA starts: set before torch is imported, as the trial did
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    import torch
    import torch.distributed as dist

    import budgettune
    from budgettune.trial import measure
    from budgettune.trial.recompute import PreparedStep, build_optimizer
    from budgettune.workload import load_workload

    on_cuda = str(pin_doc.get("device", "cpu")).startswith("cuda")
    if on_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if on_cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pinned = budgettune.load_pinned(args.pin)
        spec = pinned.spec
        if args.timed_steps is not None:
            spec = spec.replace(timed_steps=args.timed_steps)
        torch.manual_seed(spec.seed)
        workload = load_workload(pin_doc["workload"], device, pin_doc.get("workload_options"))
        model = pinned.compile(workload.model, blocks=workload.blocks)
    optimizer = build_optimizer(workload, spec, model.parameters())
    step = PreparedStep(
        model=model,
        compiled=model,
        optimizer=optimizer,
        loss_fn=workload.loss,
        batch=workload.batch,
        autocast_dtype=workload.autocast_dtype,
        device=device,
        spec=spec,
    )
    figures = measure.measure(step, spec)
    mine: dict[str, Any] = {
        "rank": rank,
        "peak_allocated_bytes": figures.peak_allocated_bytes,
        "peak_reserved_bytes": figures.peak_reserved_bytes,
        "peak_device_bytes": figures.peak_device_bytes,
        "steady_bytes": figures.steady_bytes,
        "step_time_ms": figures.step_time_ms,
        "warnings": [str(w.message) for w in caught],
    }
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    dist.barrier()  # no rank tears its group down while a peer's gather is still in flight
    dist.destroy_process_group()
    if rank != 0:
        return 0
    pinned_ranks = {row["rank"]: row for row in pin_doc["measured"].get("per_rank", [])}
    rows, within = [], True
    for row in gathered:
        expected = pinned_ranks.get(row["rank"], {}).get("peak_allocated_bytes")
        error = None if not expected else row["peak_allocated_bytes"] / expected - 1.0
        ok = error is not None and abs(error) <= args.tolerance
        within = within and ok
        rows.append({**row, "pinned_peak_allocated_bytes": expected, "relative_error": error,
                     "within_tolerance": ok})  # fmt: skip
    report = {
        "pin": str(args.pin),
        "world_size": world,
        "pinned_world_size": pin_doc.get("world_size", 1),
        "spec": spec.to_json_dict(),
        "tolerance": args.tolerance,
        "ranks": rows,
        "all_within_tolerance": within,
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(device) if on_cuda else "cpu",
    }
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    for row in rows:
        print(
            f"rank {row['rank']}: peak allocated {row['peak_allocated_bytes'] / 1e9:.3f} GB vs "
            f"pinned {(row['pinned_peak_allocated_bytes'] or 0) / 1e9:.3f} GB "
            f"({'within' if row['within_tolerance'] else 'OUTSIDE'} {args.tolerance:.0%})"
        )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
