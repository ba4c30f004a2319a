"""budgettune from Python: search a builder defined in this file, then apply the pin.

    python examples/from_python.py [MAX_MEM] [STORAGE]      # e.g. 120MB sqlite:///bt.db

Run it again: the same study resumes (two more trials), and the pin is re-verified and written
again. The builder must live in a file or module (trials run in their own processes and import
it: ``examples/from_python.py:build``), so a notebook imports it from a ``.py`` file too.
On a GPU, drop ``device`` and the CPU-sized settings.
"""

from __future__ import annotations

import sys

import torch

import budgettune
from budgettune import Workload


def build(device: torch.device, *, n_layers: int = 2, batch_size: int = 2) -> Workload:
    """The built-in tiny GPT, small: a stand-in for the user's own model and batch."""
    from budgettune.workloads.tiny_gpt import build as tiny_gpt

    return tiny_gpt(device, n_layers=n_layers, d_model=64, batch_size=batch_size, seq_len=32)


def main(max_mem: str = "120MB", storage: str = "sqlite:///budgettune.db") -> None:
    pinned = budgettune.search(
        build,
        max_mem=max_mem,
        options={"n_layers": 2},
        device="cpu",
        storage_url=storage,
        study_name="from-python",
        num_trials=2,
        top_k=1,
        reverify_runs=1,
        space={"compile_backend": "aot_eager_decomp_partition", "block_ac_every": [0, 1]},
        fix={"compile_mode": "eager"},
        trial={"warmup_steps": 1, "timed_steps": 1},
        output="from-python-pin.json",
    )
    print("pinned:", pinned.spec.describe())

    # the training job: the pin applied to the same model, exactly as the README's lines
    workload = build(torch.device("cpu"), n_layers=2)
    model = pinned.compile(workload.model)
    assert workload.optimizer is not None
    optimizer = pinned.optimizer(workload.optimizer(model.parameters()))
    losses = []
    for _ in range(2):
        loss = workload.loss(model, workload.batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print(f"trained 2 steps with the pin, loss {losses[-1]:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
