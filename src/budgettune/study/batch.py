"""Batch size in a search (issue 46): which micro-batches a search tries, the accumulation
that makes each up to the global batch, and the micro-batch of the configuration as given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from budgettune.errors import UsageError, shown_value
from budgettune.trial.knobs import is_int
from budgettune.trial.spec import TrialSpec

MAX_GLOBAL_BATCH = 1_000_000
"""The most rows one optimizer step may take (``--global-batch``)."""


def micro_batch_sizes(
    global_batch: Any, sizes: tuple[int, ...], options: Mapping[str, Any]
) -> tuple[int, ...]:
    """The micro-batches a search tries: with a global batch, a size that does not divide it
    is not tried; without one, each trial steps on its own micro-batch and the search ranks
    samples per second (`SearchSpec.ranking_rows`); none listed, the workload's
    ``batch_size`` option is the one.

    Raises:
        UsageError: one line saying what to give.
    """
    if not is_int(global_batch) or not 0 <= global_batch <= MAX_GLOBAL_BATCH:
        raise UsageError(
            f"--global-batch must be an integer from 0 to {MAX_GLOBAL_BATCH}, got "
            f"{shown_value(global_batch)}"
        )
    if not global_batch:
        return sizes
    if sizes == (0,):
        own = options.get("batch_size")
        if not is_int(own) or own <= 0:
            raise UsageError(
                f"--global-batch {global_batch} needs the micro-batches to try (--micro-batches "
                "2,4,8) or the workload's batch size (--option batch_size=N)"
            )
        sizes = (own,)
    kept = tuple(size for size in sizes if size > 0 and global_batch % size == 0)
    if not kept:
        raise UsageError(
            f"no micro-batch of {','.join(map(str, sizes))} divides --global-batch {global_batch}"
        )
    return kept


MAX_MICRO_BATCH_RANGE = 2**20
"""The largest end of a powers-of-two range of micro-batches (``1..32``)."""


def powers_of_two(text: str) -> list[int]:
    """The micro-batches a range names: ``"1..32"`` is 1, 2, 4, 8, 16, 32 (both ends powers of
    two, the first no larger than the second).

    Raises:
        UsageError: text that is not such a range, in one line.
    """
    import re

    match = re.fullmatch(r"\s*([0-9]{1,8})\.\.([0-9]{1,8})\s*", text)  # ASCII digits only
    low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    power = all(n & (n - 1) == 0 for n in (low, high))
    if not (match and power and 0 < low <= high <= MAX_MICRO_BATCH_RANGE):
        raise UsageError(
            f"micro-batches {shown_value(text)}: a list (2,4,8) or a range of powers of two from "
            f"LOW to HIGH (1..32), both powers of two up to {MAX_MICRO_BATCH_RANGE}"
        )
    sizes = []
    while low <= high:
        sizes.append(low)
        low *= 2
    return sizes


def accumulated(spec: TrialSpec, global_batch: int) -> TrialSpec:
    """``spec`` with the accumulation that makes its micro-batch up to ``global_batch`` (as it
    is without a global batch or a micro-batch of its own)."""
    if not global_batch or not spec.micro_batch:
        return spec
    return spec.replace(accum_steps=global_batch // spec.micro_batch)


def given_micro_batch(sizes: tuple[int, ...], options: Mapping[str, Any]) -> int:
    """The micro-batch of the configuration as given (the baselines'): the workload's
    ``batch_size`` where the search tries it, else the largest it tries."""
    own = options.get("batch_size")
    if isinstance(own, int) and own in sizes:
        return own
    return int(max(sizes))
