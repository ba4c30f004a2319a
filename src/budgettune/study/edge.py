"""The memory edge: the opening's budget step beside the block-AC map and the flips
(`budgettune.study.structured`, step 4).

Where a block-AC point over the limit is faster than everything that fits, the one nearest
the limit and its policy's next sparser stride are measured at lower budgets, by bisection on
the budget, until the budget that fits is known to `EDGE_RESOLUTION` (`next_edge`). "Lower the
budget until it fits" is what a person does next, and the pin often lies there: a stride
with a budget just under the limit, which the sampler reaches by chance
(benchmarks/results/README.md#memory-edge). It runs on workers the map leaves idle, as soon as
a point over the limit is known, and only in a study of `EDGE_MIN_TRIALS` trials or more.
Pure, like the rest of the opening's decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from budgettune.study.spec import SearchSpec
from budgettune.study.structured import (
    TIME_NOISE,
    Point,
    by_spec_of,
    ordered_strides,
    structured_spec,
)
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec

EDGE_PREFIX = "edge-"
"""Baseline label of a memory-edge point: ``edge-op-4-0.625`` (policy, stride, budget)."""
EDGE_MIN_TRIALS = 16
"""From this many trials (the study's target) the opening bisects the budget at the memory
edge. A 12-trial study keeps the trials its map leaves to the sampler (issue 30's grid30
searches, 12 trials each, ran without it). With four workers, a 20-trial study's map finishes
when about 17 trials have started (L3, 2026-11-27), so the edge runs beside the map, on the
workers it leaves idle."""
EDGE_RESOLUTION = 0.125
"""The budget bisection stops once the highest budget that fits and the lowest over the limit
are this close: three points from [0, 1] (0.5, then 0.75 or 0.25, then the eighth between)."""


def edge_label(policy: str, stride: int, budget: float) -> str:
    """The baseline label of a memory-edge point."""
    return EDGE_PREFIX + (f"{policy}-{stride}" if stride else "none") + f"-{budget:g}"


def _pair(strides: Sequence[int], policy: str, index: int) -> list[tuple[str, int]]:
    """An edge's (policy, stride) and its policy's next sparser stride."""
    return [(policy, strides[index]), *[(policy, s) for s in strides[index + 1 : index + 2]]]


def edge_strides(
    search: SearchSpec,
    points: Sequence[Point],
    by_spec: Mapping[TrialSpec, Point],
    base: TrialSpec,
    policies: Sequence[str],
) -> list[tuple[str, int]]:
    """The (policy, stride) pairs whose budget is worth lowering: of each policy's first
    structured point measured over the limit, those faster than every finished point that fits
    (beyond `TIME_NOISE`; a lower budget only slows a point down), the one nearest the limit
    (the least memory to give back in recompute); then the next sparser stride of its policy
    (less recompute, more memory: over at budget 1.0 too, by the map).

    Once an edge point is queued the pair is kept until both are bisected: a fit the edge finds
    near the top's time, or a nearer point over the limit the map finds later, would otherwise
    drop the sparser stride unmeasured, or leave both half done.

    Nearest, not fastest: at L3 op AC every 2nd block and full AC every 4th were over at
    23.2-23.8 and 23.8-24.5 GB, within 1 % of each other in time, in either order; the pins
    that beat the grid were op AC every 2nd or 4th block with a budget."""
    strides = ordered_strides(search)
    first = next((p for p in points if (p.label or "").startswith(EDGE_PREFIX)), None)
    if first is not None:  # the pair chosen when the first edge point was queued
        kept: str = first.spec.block_ac_policy if first.spec.block_ac_every else "full"
        every = first.spec.block_ac_every
        return _pair(strides, kept, strides.index(every)) if every in strides else []
    fitting = [
        p.step_time_ms for p in by_spec.values() if p.finished and p.fits and p.step_time_ms
    ]
    if not fitting:
        return []
    faster_than = min(fitting) * (1 - TIME_NOISE)
    over: list[tuple[int, float, str, int]] = []
    for policy in policies:
        for index, stride in enumerate(strides):
            point = by_spec.get(structured_spec(base, policy, stride))
            if point is None or not point.finished or point.fits:
                continue
            ms, peak = point.step_time_ms, point.peak_bytes
            if point.outcome == "ok" and ms is not None and peak is not None and ms < faster_than:
                over.append((peak, ms, policy, index))
            break  # this policy's first stride over the limit
    if not over:
        return []
    _, _, policy, index = min(over)
    return _pair(strides, policy, index)


def _runnable(spec: TrialSpec) -> bool:
    """Whether the budget moves anything in ``spec`` and it can run as asked (an offloading
    base under the op policy with a budget below 1 is a pairing the search leaves out)."""
    offload = KNOB_BY_NAME["offload_every"]
    return KNOB_BY_NAME["activation_memory_budget"].relevant(spec) and (
        not spec.offload_every or offload.relevant(spec)
    )


def next_edge(
    search: SearchSpec,
    points: Sequence[Point],
    base: TrialSpec,
    policies: Sequence[str],
    target: int,
) -> tuple[str, TrialSpec] | None:
    """The next memory-edge point (the opening's step 4), or None: none worth measuring, both
    edges busy, mapped to `EDGE_RESOLUTION` or stopped, the budget fixed or moving nothing
    (eager), or a study of fewer than `EDGE_MIN_TRIALS`.

    Each edge (`edge_strides`) is bisected on the budget on its own: the highest budget
    measured to fit (else the searched range's low end) and the lowest measured over the limit
    or out of memory (else the range's high end) bound the next budget, their middle. Any other
    failure (a crash, a timeout, numerics off) stops that edge: a lower budget would not cure
    it. While a point runs, one more worker may take the middle of the half above it (the
    budget that fits is wanted as high as it goes), so four workers map both edges in about two
    rounds; with two points of an edge running, that edge waits.

    Args:
        search: the search (its strides and budget range).
        points: every trial of the study, finished or not.
        base: the configuration at the settled knobs, as given otherwise.
        policies: the block-AC policies still searched.
        target: the study's trial target.
    """
    space = search.space
    if target < EDGE_MIN_TRIALS or "activation_memory_budget" in space.fixed:
        return None
    by_spec = by_spec_of(points)
    for policy, stride in edge_strides(search, points, by_spec, base, policies):
        top = structured_spec(base, policy, stride)
        low, high, broken = space.budget_low, space.budget_high, False
        running: list[float] = []
        for spec, point in by_spec.items():
            if spec.replace(activation_memory_budget=1.0) != top:
                continue
            if not point.finished:
                running.append(spec.activation_memory_budget)
            elif point.outcome == "ok" and point.fits:
                low = max(low, spec.activation_memory_budget)
            elif point.outcome in ("ok", "oom"):
                high = min(high, spec.activation_memory_budget)
            else:
                broken = True
        if broken or len(running) > 1:
            continue
        if running and low < running[0] < high:
            low = running[0]  # as if it fits: the half above it
        if high - low <= EDGE_RESOLUTION:
            continue
        middle = round((low + high) / 2, 3)
        spec = top.replace(activation_memory_budget=middle)
        if _runnable(spec) and spec not in by_spec:
            return edge_label(policy, stride, middle), spec
    return None
