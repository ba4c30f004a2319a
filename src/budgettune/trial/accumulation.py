"""Gradient accumulation in a trial (issue 46): a micro-batch's forward+backward passes and
the optimizer step timed apart, and the rows of a batch."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from budgettune.trial.recompute import PreparedStep


def batch_tokens(batch: Any) -> int:
    """Tokens of a language model's batch: the size of its first tensor when that is a
    rows x sequence tensor of integers (token ids); 0 for any other batch (images, features)."""
    import torch
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            tokens = leaf.dim() == 2 and not leaf.is_floating_point() and not leaf.is_complex()
            return int(leaf.numel()) if tokens and leaf.dtype != torch.bool else 0
    return 0


def batch_rows(batch: Any) -> int:
    """Rows of a batch pytree: the leading size of its first tensor (0: none has one)."""
    import torch
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 0


class Clock(Protocol):
    """Marks points of a step and reads the milliseconds between them (`CpuClock`,
    `CudaClock`)."""

    def mark(self) -> Any:
        """A point in the step's time."""

    def settle(self, last: Any) -> None:
        """Wait until ``last`` is reached (the device's work done)."""

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two settled marks."""


class CpuClock:
    """The host's clock: the step runs as it is called."""

    def mark(self) -> float:
        return time.perf_counter()

    def settle(self, last: Any) -> None:
        pass

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3


class CudaClock:
    """CUDA events on the current stream: the passes are marked as they are queued and the
    step is synchronized once, at its end, so that timing them apart does not make the host
    wait between passes (a job's loop does not)."""

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self, last: Any) -> None:
        last.synchronize()

    def ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


def timed_apart(
    step: PreparedStep, timed_steps: int, clock: Clock
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
        marks = [clock.mark()]
        for _ in range(step.spec.accum_steps):
            step.forward_backward()
            marks.append(clock.mark())
        step.optimizer_step()
        marks.append(clock.mark())
        clock.settle(marks[-1])
        passes += [clock.ms(a, b) for a, b in zip(marks[:-2], marks[1:-1], strict=True)]
        optimizer.append(clock.ms(marks[-2], marks[-1]))
    split = (statistics.median(passes), statistics.median(optimizer))
    times = [step.spec.accum_steps * split[0] + opt for opt in optimizer]
    return times, split
