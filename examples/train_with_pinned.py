"""A training loop that applies a budgettune pin with the README's three lines, and checks its
own third step against the pin's figures.

budgettune search --max-mem 120MB --trials 8 --output best.json
python examples/train_with_pinned.py best.json
"""

from __future__ import annotations

import sys

import budgettune


def main(pin_path: str, steps: int = 3) -> list[float]:
    pinned = budgettune.load_pinned(pin_path)  # first: the allocator setting, before CUDA starts
    import torch

    from budgettune.workloads.tiny_gpt import build

    torch.manual_seed(0)
    workload = build(torch.device("cpu"))
    model = pinned.compile(workload.model)  # model changes, block AC, compile (scoped)
    optimizer = pinned.optimizer(torch.optim.AdamW(workload.model.parameters(), lr=1e-4))

    def train_step() -> float:
        loss = workload.loss(model, workload.batch)  # the loss calls model(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.item())

    losses = []
    for step in range(steps):
        if step != 2:
            losses.append(train_step())
            continue
        # the trial measured its third step: measure this job's the same way (on CPU, say
        # what is live before the step)
        live = {"model": workload.model, "optimizer": optimizer, "batch": workload.batch}
        with pinned.measure_step(**live) as meter:
            losses.append(train_step())
        assert meter.result is not None
        print(meter.result.summary())
    return losses


if __name__ == "__main__":
    for step, value in enumerate(main(sys.argv[1] if len(sys.argv) > 1 else "best.json")):
        print(f"step {step}: loss {value:.4f}")
