"""The host figures of a trial's measured step with offload (`Measurement.host_peak_bytes`,
`Measurement.offload_bytes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from budgettune.trial.recompute import PreparedStep


def _offloads(step: PreparedStep) -> bool:
    return step.offload is not None or step.spec.compiled_offload


def start_host_window(step: PreparedStep) -> None:
    """Start the measured step's host figures (offload only)."""
    if not _offloads(step):
        return
    if step.offload is not None:
        step.offload.ledger.reset_peak()
    if step.device.type == "cuda":
        import torch

        reset = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
        if callable(reset):
            reset()


def host_window(step: PreparedStep) -> tuple[int, int]:
    """The measured step's host peak and bytes offloaded (see `Measurement.host_peak_bytes`);
    (0, 0) without offload. The compiled offload (``op_offload``) has no ledger: its host peak
    is the pinned allocator's (CUDA), its bytes moved are not counted (0)."""
    if not _offloads(step):
        return 0, 0
    ledger = step.offload.ledger if step.offload is not None else None
    peak = ledger.peak_bytes if ledger is not None else 0
    if step.device.type == "cuda":
        import torch

        stats = getattr(torch.cuda, "host_memory_stats", None)
        pinned = stats().get("allocated_bytes.peak") if callable(stats) else None
        if isinstance(pinned, int) and pinned > 0:
            peak = max(peak, pinned)
    return peak, ledger.moved_bytes if ledger is not None else 0
