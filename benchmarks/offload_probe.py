"""Issue 33 feasibility probe (not the knob): which offload mechanisms run on a GPU host's
torch, and what they do to the peak, on the built-in tiny GPT made large enough for its
activations to dominate.

    python benchmarks/offload_probe.py VARIANT --output out.json
    VARIANT: none | op | op-offload-compiled | hooks-per-block | hooks-whole-compiled

- ``none``: whole-model `torch.compile`, no checkpointing.
- ``op``: block AC on every block with torchtitan's op policy (`trial.block_ac`), compiled.
- ``op-offload-compiled``: budgettune's ``block_ac_policy="op_offload"``: the same policy, the
  partitioner's offloading on (``enable_activation_offloading``, separate stream, wait
  sinking, reload prefetch) and its marking pass (``joint_custom_pass``), compiled.
- ``hooks-per-block``: each block compiled on its own, its call wrapped in
  ``save_on_cpu(pin_memory=True)`` (the hooks sit outside the compiled regions).
- ``hooks-whole-compiled``: ``save_on_cpu(pin_memory=True)`` inside each block's forward,
  the whole model compiled (does dynamo take the hooks?).

Peak allocated/reserved over the third step and the median of 5 steps; run each variant in its
own process. Timings of variants run side by side on one GPU are not comparable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from typing import Any

import torch

from budgettune.trial.offload import compiled_offload_settings

VARIANTS = ("none", "op", "op-offload-compiled", "hooks-per-block", "hooks-whole-compiled")


def build(variant: str) -> tuple[torch.nn.Module, Any, Any]:
    from budgettune.trial.block_ac import apply_block_ac
    from budgettune.workloads.tiny_gpt import build as tiny_gpt

    torch.manual_seed(0)
    w = tiny_gpt(
        torch.device("cuda"), vocab_size=32000, d_model=1024, n_layers=6, n_heads=16,
        batch_size=8, seq_len=1024,
    )  # fmt: skip
    model, blocks = w.model, list(w.blocks or ())
    if variant == "op":
        apply_block_ac(blocks, 1, "op")
    elif variant == "op-offload-compiled":
        # budgettune's own op_offload: the op policy, the partitioner's offloading and the
        # pass that marks what the policy saves (set globally: this process runs one variant)
        import torch._functorch.config as cfg

        from budgettune.trial.partitioner import functorch_settings
        from budgettune.trial.spec import TrialSpec

        apply_block_ac(blocks, 1, "op_offload")
        spec = TrialSpec(block_ac_every=1, block_ac_policy="op_offload")
        for key, value in functorch_settings(spec, cfg).items():
            if key != "activation_memory_budget":
                setattr(cfg, key, value)
    elif variant == "hooks-whole-compiled":
        for block in blocks:
            inner = block.forward

            def hooked(*a: Any, _inner: Any = inner, **k: Any) -> Any:
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    return _inner(*a, **k)

            block.forward = hooked  # type: ignore[method-assign]
    if variant == "hooks-per-block":
        for block in blocks:
            compiled = torch.compile(block.forward)

            def hooked_compiled(*a: Any, _c: Any = compiled, **k: Any) -> Any:
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    return _c(*a, **k)

            block.forward = hooked_compiled  # type: ignore[method-assign]
        step_model = model
    else:
        step_model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return step_model, (w.loss, w.batch), optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    out: dict[str, Any] = {
        "variant": args.variant,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "config_has": compiled_offload_settings(),
    }
    try:
        model, (loss_fn, batch), optimizer = build(args.variant)
        times = []
        for step in range(8):
            if step == 2:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1000)
            if step == 2:
                out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            out["loss"] = float(loss)
        out["step_ms_median"] = statistics.median(times[3:])
        out["first_steps_ms"] = times[:3]
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a probe reports what failed
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}"
        out["traceback"] = traceback.format_exc()[-3000:]
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "traceback"}))


if __name__ == "__main__":
    main()
