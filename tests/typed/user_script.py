"""What a user writes, type-checked by `.ci/run` with ``mypy --strict`` against budgettune as
the README installs it (issue 47); not run. `misspelt_keyword.py` beside it must fail."""

from __future__ import annotations

import torch

import budgettune
from budgettune import BudgettuneError, PinnedConfig, Workload


def build(device: torch.device, *, batch_size: int = 8) -> Workload:
    from budgettune.workloads.tiny_gpt import build as tiny_gpt

    return tiny_gpt(device, batch_size=batch_size)


def search() -> PinnedConfig:
    try:
        return budgettune.search(
            build,
            max_mem="20GB",
            options={"batch_size": 8},
            num_trials=20,
            global_batch=32,
            space={"micro_batches": [4, 8, 16]},
        )
    except BudgettuneError as error:
        raise SystemExit(f"error: {error}") from None


def job(model: torch.nn.Module) -> torch.nn.Module:
    pinned = budgettune.load_pinned("budgettune-pin.json")
    arguments: dict[str, int] = pinned.batch_arguments()
    assert arguments["gradient_accumulation_steps"] >= 1
    return pinned.compile(model)
