"""What a pin, `show` and the dashboard say when the binding peak is one recompute cannot
lower: the allocator's reserve far above what was allocated, or the optimizer step."""

from __future__ import annotations

from budgettune.trial.spec import EXPANDABLE

#: The allocator's reserved peak above its allocated peak that is worth a word: past this
#: fraction of the allocated peak, fragmentation decides whether a configuration fits.
RESERVED_GAP_FRACTION = 0.15


def allocator_advice(
    *, peak_allocated_bytes: int, peak_reserved_bytes: int, mem_metric: str, alloc_conf: str
) -> str:
    """What to say when the binding peak is the allocator's reserve, far above what was used.

    Only for the ``reserved`` and ``device`` metrics (the allocated peak has no such gap) and
    only when expandable segments are not already on.
    """
    if mem_metric == "allocated" or EXPANDABLE in alloc_conf:
        return ""
    gap = peak_reserved_bytes - peak_allocated_bytes
    if peak_allocated_bytes <= 0 or gap <= RESERVED_GAP_FRACTION * peak_allocated_bytes:
        return ""
    return (
        f"the allocator reserved {gap / 1e9:.2f} GB above the {peak_allocated_bytes / 1e9:.2f} "
        "GB allocated (fragmentation), and the limit is checked against that reserve; "
        "cuda_alloc_conf=expandable_segments:True usually closes the gap (the search tries it "
        "on CUDA: --cuda-alloc-confs default,expandable_segments:True)"
    )


def phase_advice(peak_phase: str | None) -> str:
    """What to say when the peak sits in a phase recompute cannot lower."""
    if peak_phase == "optimizer":
        return (
            "the peak is set in the optimizer step, which recompute cannot lower; "
            "try the optimizer knob (optimizer_impl=fused or foreach)"
        )
    return ""
