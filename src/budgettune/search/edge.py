"""The memory edge: the opening's step after the block-AC map and the flips
(`budgettune.search.structured`, step 4).

Where the fastest block-AC point over the limit is faster than everything that fits, its
stride and its policy's next sparser one are measured at lower budgets, by bisection on the
budget, until the budget that fits is known to `EDGE_RESOLUTION` (`next_edge`). "Lower the
budget until it fits" is what a person does next, and the pin often lies there: a stride
with a budget just under the limit, which a sampler with the opening's few trials left
reaches by chance (benchmarks/results/README.md#memory-edge). Only while the study has
`EDGE_MIN_LEFT` trials still to start. Pure, like the rest of the opening's decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from budgettune.search.spec import SearchSpec
from budgettune.search.structured import (
    TIME_NOISE,
    Point,
    by_spec_of,
    ordered_strides,
    structured_spec,
)
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec

EDGE_PREFIX = "edge-"
"""Baseline label of a memory-edge point: ``edge-op-4-0.625`` (policy, stride, budget)."""
EDGE_MIN_LEFT = 4
"""A memory-edge point is queued only while at least this many trials (it included) are still
to start: the last trials stay the sampler's, and a 12-trial study, whose opening takes 9-11
of them, runs as before."""
EDGE_RESOLUTION = 0.125
"""The budget bisection stops once the highest budget that fits and the lowest over the limit
are this close: three points from [0, 1] (0.5, then 0.75 or 0.25, then the eighth between)."""


def edge_label(policy: str, stride: int, budget: float) -> str:
    """The baseline label of a memory-edge point."""
    return EDGE_PREFIX + (f"{policy}-{stride}" if stride else "none") + f"-{budget:g}"


def _edge_strides(
    search: SearchSpec,
    by_spec: Mapping[TrialSpec, Point],
    base: TrialSpec,
    policies: Sequence[str],
) -> list[tuple[str, int]]:
    """The (policy, stride) pairs whose budget is worth lowering: the fastest structured point
    measured over the limit, when it is faster than every finished point that fits (beyond
    `TIME_NOISE`), and the next sparser stride of its policy (less recompute, more memory:
    over at budget 1.0 too, by the map)."""
    fitting = [
        p.step_time_ms for p in by_spec.values() if p.finished and p.fits and p.step_time_ms
    ]
    strides = ordered_strides(search)
    over: list[tuple[float, str, int]] = []
    for policy in policies:
        for index, stride in enumerate(strides):
            point = by_spec.get(structured_spec(base, policy, stride))
            if point is not None and point.finished and not point.fits:
                if point.outcome == "ok" and point.step_time_ms is not None:
                    over.append((point.step_time_ms, policy, index))
                break  # this policy's first stride over the limit
    if not fitting or not over:
        return []
    fastest_ms, policy, index = min(over)
    if fastest_ms >= min(fitting) * (1 - TIME_NOISE):
        return []  # lowering its budget would only make it slower than what fits already
    sparser = [(policy, strides[index + 1])] if index + 1 < len(strides) else []
    return [(policy, strides[index]), *sparser]


def next_edge(
    search: SearchSpec,
    points: Sequence[Point],
    base: TrialSpec,
    policies: Sequence[str],
    trials_left: int,
) -> tuple[str, TrialSpec] | None:
    """The next memory-edge point (the opening's step 4), or None: none worth measuring, the
    two edges busy, both mapped to `EDGE_RESOLUTION`, or fewer than `EDGE_MIN_LEFT` trials
    left.

    Each edge (`_edge_strides`) is bisected on the budget on its own, so two workers can
    measure both at once: the highest budget measured to fit (else the searched range's low
    end) and the lowest over the limit (out of memory and crashes count as over; else the
    range's high end) bound the next budget, their middle.

    Args:
        search: the search (its strides and budget range).
        points: every trial of the study, finished or not.
        base: the configuration at the settled knobs, as given otherwise.
        policies: the block-AC policies still searched.
        trials_left: trials the study may still start, the one this asks for included.
    """
    space = search.space
    if trials_left < EDGE_MIN_LEFT or "activation_memory_budget" in space.fixed:
        return None
    budget = KNOB_BY_NAME["activation_memory_budget"]
    by_spec = by_spec_of(points)
    for policy, stride in _edge_strides(search, by_spec, base, policies):
        top = structured_spec(base, policy, stride)
        low, high, busy = space.budget_low, space.budget_high, False
        for spec, point in by_spec.items():
            if spec.replace(activation_memory_budget=1.0) != top:
                continue
            if not point.finished:
                busy = True
            elif point.fits:
                low = max(low, spec.activation_memory_budget)
            else:
                high = min(high, spec.activation_memory_budget)
        if busy or high - low <= EDGE_RESOLUTION:
            continue
        middle = round((low + high) / 2, 3)
        spec = top.replace(activation_memory_budget=middle)
        if budget.relevant(spec) and spec not in by_spec:
            return edge_label(policy, stride, middle), spec
    return None
