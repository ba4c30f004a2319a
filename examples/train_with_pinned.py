"""A training loop that applies a budgettune pin in one line.

budgettune search --max-mem 120MB --trials 8 --output best.json
python examples/train_with_pinned.py best.json
"""

from __future__ import annotations

import sys

import torch

import budgettune
from budgettune.workloads.tiny_gpt import build


def main(pin_path: str, steps: int = 3) -> list[float]:
    pinned = budgettune.load_pinned(pin_path)  # warns if torch / GPU / workload differ
    torch.manual_seed(0)
    workload = build(torch.device("cpu"))
    model = pinned.compile(workload.model)  # functorch config scoped, op list, block AC, mode
    optimizer = pinned.optimizer(torch.optim.AdamW(workload.model.parameters(), lr=1e-4))
    losses = []
    for _ in range(steps):
        loss = workload.loss(model, workload.batch)  # the loss calls model(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    for step, value in enumerate(main(sys.argv[1] if len(sys.argv) > 1 else "best.json")):
        print(f"step {step}: loss {value:.4f}")
