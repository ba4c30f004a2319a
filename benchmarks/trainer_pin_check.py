"""A transformers `Trainer` run with a pin applied through `PinCallback`, its third step's peak
against the pin's (issue 32: within 1 % on a GPU).

    python benchmarks/trainer_pin_check.py --pin best.json --output trainer-check.json

The pin must name a workload whose model is a `transformers` model trained on a dict batch
with its own loss (``hf:...`` references, or a ``write_workload`` folder's ``build.py``). The
job is a user's: `PinCallback(pin)` first (the allocator setting, before CUDA is touched), then
the pinned workload built as the pin names it (same reference and options, the model on the
GPU), then a `Trainer` given that model, a dataset that yields the workload's batch, and the
optimizer a trial steps (the workload's own, else ``AdamW(lr=1e-4)``; the callback applies the
pinned implementation flag). What a trial's step does not do is turned off: gradient clipping
(``max_grad_norm=0``), mixed-precision autocast (the model is in the workload's dtype), the
scheduler's warm-up (constant). The third step (two warm-up steps compile, as in a trial) is
measured with ``pinned.measure_step()``, from ``on_step_begin`` to ``on_step_end`` (forward,
backward, optimizer step, ``zero_grad``), then ``--steps`` more are timed. Exit 0 when the
peak is within ``--tolerance`` of the pin's (on the pin's metric), 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

MEASURED_STEP = 2  # 0-based: the third, as a trial measures after two warm-up steps


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pin", required=True, help="the pinned JSON")
    parser.add_argument("--output", required=True, help="where to write the report (JSON)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the measured one")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative, default 1 %%")
    return parser.parse_args(argv)


class _Batches:
    """A dataset of ``rows`` items whose collated batch is the workload's batch itself."""

    def __init__(self, batch: dict[str, Any], steps: int) -> None:
        self.batch, self.rows = batch, steps * _rows(batch)

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> int:
        return index

    def collate(self, _indices: list[int]) -> dict[str, Any]:
        return self.batch


def _rows(batch: dict[str, Any]) -> int:
    return int(next(iter(batch.values())).shape[0])


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    pin_doc = json.loads(Path(args.pin).read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        import transformers

        from budgettune.integrations.transformers import PinCallback
        from budgettune.workload import load_workload

        pin = PinCallback(args.pin)  # first: the allocator setting, before CUDA is touched
        pinned = pin.pin.pinned
        on_cuda = str(pin_doc.get("device", "cpu")).startswith("cuda")
        device = torch.device("cuda", 0) if on_cuda else torch.device("cpu")
        torch.manual_seed(0)
        workload = load_workload(pin_doc["workload"], device, pin_doc.get("workload_options"))
        model = workload.model
        make = workload.optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-4))
        optimizer = make(model.parameters())
        data = _Batches(workload.batch, MEASURED_STEP + 1 + args.steps)
        meter_box: dict[str, Any] = {}
        times_ms: list[float] = []

        class StepMeter(transformers.TrainerCallback):  # type: ignore[misc]
            """Measures the third step with the pin's meter, times the later ones."""

            def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == MEASURED_STEP:
                    live = {"model": model, "optimizer": optimizer, "batch": workload.batch}
                    meter = pinned.measure_step(device=device, **({} if on_cuda else live))
                    meter.__enter__()
                    meter_box["meter"] = meter
                elif state.global_step > MEASURED_STEP:
                    if on_cuda:
                        torch.cuda.synchronize(device)
                    meter_box["start"] = time.perf_counter()

            def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == MEASURED_STEP + 1:
                    meter_box["meter"].__exit__(None, None, None)
                elif state.global_step > MEASURED_STEP + 1:
                    if on_cuda:
                        torch.cuda.synchronize(device)
                    times_ms.append((time.perf_counter() - meter_box["start"]) * 1e3)

        with tempfile.TemporaryDirectory() as output_dir:
            training = transformers.TrainingArguments(
                output_dir=output_dir,
                max_steps=MEASURED_STEP + 1 + args.steps,
                per_device_train_batch_size=_rows(workload.batch),
                max_grad_norm=0.0,
                lr_scheduler_type="constant",
                logging_steps=10_000,
                save_strategy="no",
                report_to="none",
                use_cpu=not on_cuda,
                disable_tqdm=True,
                dataloader_pin_memory=False,
                remove_unused_columns=False,
            )
            trainer = transformers.Trainer(
                model=model,
                args=training,
                train_dataset=data,  # type: ignore[arg-type]
                data_collator=data.collate,
                optimizers=(optimizer, None),
                callbacks=[pin, StepMeter()],
            )
            trainer.train()
    check = meter_box["meter"].result
    assert check is not None
    from budgettune.integrations.trainer_pin import torch_optimizer
    from budgettune.pinning import StalePinWarning

    report = {
        "pin": str(args.pin),
        "spec": pin_doc["spec"],
        "model_changes": pin_doc.get("model_changes"),
        **check.to_json_dict(),
        "summary": check.summary(),
        "tolerance": args.tolerance,
        "within_tolerance": check.relative_error is not None
        and abs(check.relative_error) <= args.tolerance,
        "median_step_ms": sorted(times_ms)[len(times_ms) // 2] if times_ms else None,
        "model_use_cache": bool(getattr(model.config, "use_cache", False)),
        "optimizer_defaults": {
            k: v
            for k, v in torch_optimizer(trainer.optimizer).defaults.items()
            if k in ("foreach", "fused", "lr")
        },
        "allocator": pin.pin.allocator.how,
        "pin_warnings": [str(w.message) for w in caught if w.category is StalePinWarning],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if on_cuda else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    Path(args.output).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"{Path(args.pin).name} (Trainer + PinCallback): {check.summary()}")
    return 0 if report["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
