"""Gradient accumulation in a trial (issue 46): a micro-batch's forward+backward passes and
the optimizer step timed apart, and the rows of a batch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from budgettune.trial.recompute import PreparedStep


def batch_rows(batch: Any) -> int:
    """Rows of a batch pytree: the leading size of its first tensor (0: none has one)."""
    import torch
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 0


Timer = Callable[[Callable[[], object]], float]
"""Runs a callable and returns its milliseconds (`cpu_timer`, `cuda_timer`)."""


def cpu_timer(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def cuda_timer(run: Callable[[], object]) -> float:
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def timed_apart(
    step: PreparedStep, timed_steps: int, timer: Timer
) -> tuple[list[float], tuple[float, float]]:
    """The timed steps of an accumulating step, its forward+backward passes and its optimizer
    step timed apart (issue 46): each timed step's time is the accumulation steps x the median
    pass plus the median optimizer step, so a pass that waited on the host once does not
    count ``accum_steps`` times.

    Returns:
        The per-step times (ms) and (median pass, median optimizer step).
    """
    passes: list[float] = []
    optimizer: list[float] = []
    for _ in range(timed_steps):
        for _ in range(step.spec.accum_steps):
            passes.append(timer(step.forward_backward))
        optimizer.append(timer(step.optimizer_step))
    split = (statistics.median(passes), statistics.median(optimizer))
    times = [step.spec.accum_steps * split[0] + opt for opt in optimizer]
    return times, split
