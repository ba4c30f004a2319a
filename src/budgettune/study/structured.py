"""The opening a person would try (issue 30): settle the free choices, then map block AC.

A hand grid's winner is usually a structured point (checkpoint every 2nd block, the fused
optimizer), and a sampler spread over a wide space (a continuous budget, solvers, op toggles,
strides, policies, optimizers, allocators) pairs them late
(benchmarks/results/README.md#structured-opening). So a study of
`STRUCTURED_MIN_TRIALS` trials or more opens with:

1. **settle probes**: each free choice that often wins on both axes (the fused optimizer,
   expandable segments on CUDA) measured once, flipped, at full block AC (the configuration
   most likely to run). A value that is no worse on memory and time, and better on one beyond
   noise, is held for the rest of the study (`settle`); a knob where neither value dominates
   stays searched;
2. **structured points**: block AC every k blocks for each policy at the settled knobs,
   placed by bisection on the memory axis (`next_structured`): more blocks checkpointed never
   holds more memory, so a stride that fits rules out the smaller ones (slower) and a stride
   over the limit rules out the larger ones; "no block AC" is the largest stride; with offload
   searched, the leanest point over the limit is measured once more, offloading (`_offload_point`);
3. **flips**: a free choice its probe left unsettled (neither value won beyond noise at full
   block AC, where the step is mostly recompute) is measured flipped at the fastest point
   that fits (`next_flip`), as soon as no structured point is left to queue, and again at a
   new incumbent (at most `MAX_FLIPS`): where it matters is where the pin will be
   (benchmarks/results/README.md#flip-at-incumbent);
4. **the memory edge** (`budgettune.study.edge`), beside the map: the highest budget that
   fits, at the block-AC point over the limit nearest to it and its next sparser stride;
5. then the sampler, with the settled knobs held, refines budgets, op lists and solvers
   around what fits.

Everything here is pure: it reads what was measured (`Point`) and says what to measure next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgettune.study.batch import accumulated
from budgettune.study.spec import SearchSpec
from budgettune.trial.spec import EXPANDABLE, KNOB_BY_NAME, TrialSpec

STRUCTURED_MIN_TRIALS = 8
"""From this many trials a study opens with settle probes and structured points."""
SETTLE_PREFIX = "settle-"
"""Baseline label of a settle probe: ``settle-optimizer_impl``."""
STRUCTURED_PREFIX = "structured-"
"""Baseline label of a structured point: ``structured-full-2``, ``structured-none``."""
FLIP_PREFIX = "flip-"
"""Baseline label of an unsettled free choice tried at the incumbent: ``flip-optimizer_impl``."""
TIME_NOISE = 0.01
"""Relative step-time difference below which two configurations are equally fast."""
PEAK_NOISE = 0.002
"""Relative peak difference below which two configurations hold the same memory."""
MAX_FLIPS = 2
"""Flips of one unsettled free choice in a study, each at the incumbent of its time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    """One trial of the study as the opening sees it."""

    label: str | None
    """Its baseline label (None: the sampler's)."""
    spec: TrialSpec
    """The configuration."""
    finished: bool
    """Whether it has an outcome (running or queued: not yet)."""
    outcome: str | None = None
    """``ok``, ``oom``, ``crashed``... when finished."""
    peak_bytes: int | None = None
    """Peak on the study's memory metric, when measured."""
    step_time_ms: float | None = None
    """Median step time, when measured, as the search ranks it (`TrialSpec.ranked_ms`: in a
    search over micro-batches without a global batch, scaled to the given micro-batch's
    rows)."""
    fits: bool | None = None
    """Peak x (1 + margin) within the limit (None: not measured)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settlement:
    """A free choice held for the rest of a study."""

    knob: str
    """The `TrialSpec` field."""
    value: Any
    """The value held."""
    reason: str
    """Why, with the two measurements."""

    def to_json_dict(self) -> dict[str, Any]:
        """The study attr's form (`SETTLED_ATTR`)."""
        return {"value": self.value, "reason": self.reason}


def _free_choices(search: SearchSpec) -> list[tuple[str, Any]]:
    """The searched two-way choices worth settling first, with the value probed."""
    space, out = search.space, []
    if "optimizer_impl" not in space.fixed and {"fused"} < set(space.optimizer_impls):
        out.append(("optimizer_impl", "fused"))
    if "cuda_alloc_conf" not in space.fixed and {EXPANDABLE} < set(space.cuda_alloc_confs):
        out.append(("cuda_alloc_conf", EXPANDABLE))
    return out


def wants_structured_opening(search: SearchSpec, target: int | None = None) -> bool:
    """Whether the study is long enough, and block AC searched, for the structured opening.

    ``target``: the study's trial target, when it has one (a resumed study: this search's
    ``num_trials`` is only what it adds).
    """
    strides = [s for s in search.space.block_ac_every if s > 0]
    return (
        max(search.num_trials, target or 0) >= STRUCTURED_MIN_TRIALS
        and "block_ac_every" not in (search.space.fixed)
        and bool(strides)
    )


def settle_probes(search: SearchSpec, full_ac: TrialSpec) -> list[tuple[str, TrialSpec]]:
    """The settle probes: full block AC (``full_ac``, as given) with one free choice flipped."""
    if search.num_trials < STRUCTURED_MIN_TRIALS:
        return []
    return [
        (SETTLE_PREFIX + knob, full_ac.replace(**{knob: value}))
        for knob, value in _free_choices(search)
    ]


def _dominates(a: Point, b: Point) -> bool:
    """``a`` is no worse than ``b`` on memory and time, and better on one beyond noise."""
    assert a.peak_bytes is not None and b.peak_bytes is not None
    assert a.step_time_ms is not None and b.step_time_ms is not None
    no_worse = a.peak_bytes <= b.peak_bytes * (
        1 + PEAK_NOISE
    ) and a.step_time_ms <= b.step_time_ms * (1 + TIME_NOISE)
    better = a.peak_bytes < b.peak_bytes * (1 - PEAK_NOISE) or a.step_time_ms < b.step_time_ms * (
        1 - TIME_NOISE
    )
    return no_worse and better


def _figures(point: Point) -> str:
    return f"{(point.peak_bytes or 0) / 1e9:.3f} GB, {point.step_time_ms or 0:.1f} ms"


def settle(points: Sequence[Point], reference_label: str) -> list[Settlement]:
    """The free choices decided by the finished settle probes against the reference.

    Args:
        points: the study's trials.
        reference_label: the label of the probes' reference (full block AC, as given).

    Returns:
        One settlement per probe whose value or the reference's dominates; a probe that
        crashed while the reference ran settles the reference's value (the probed one cannot
        run here, e.g. ``fused`` for an optimizer without that flag).
    """
    reference = next((p for p in points if p.label == reference_label and p.finished), None)
    if reference is None or reference.outcome != "ok":
        return []
    settled = []
    for probe in points:
        if not (probe.label or "").startswith(SETTLE_PREFIX) or not probe.finished:
            continue
        knob = (probe.label or "")[len(SETTLE_PREFIX) :]
        tried, given = getattr(probe.spec, knob), getattr(reference.spec, knob)
        if probe.outcome == "crashed":
            settled.append(Settlement(knob=knob, value=given, reason=f"{tried!r} crashed"))
        elif probe.outcome != "ok":
            continue  # out of memory or broken numerics: no comparison on both axes
        elif _dominates(probe, reference):
            reason = f"{tried!r} {_figures(probe)} vs {given!r} {_figures(reference)}"
            settled.append(Settlement(knob=knob, value=tried, reason=reason))
        elif _dominates(reference, probe):
            reason = f"{given!r} {_figures(reference)} vs {tried!r} {_figures(probe)}"
            settled.append(Settlement(knob=knob, value=given, reason=reason))
    return settled


def ordered_strides(search: SearchSpec) -> list[int]:
    """Block-AC strides from most to least checkpointing; 0 (no block AC) last."""
    strides = sorted({s for s in search.space.block_ac_every if s > 0})
    return strides + ([0] if 0 in search.space.block_ac_every else [])


def by_spec_of(points: Sequence[Point]) -> dict[TrialSpec, Point]:
    """Each configuration's point, a finished one before one running or queued."""
    by_spec: dict[TrialSpec, Point] = {}
    for point in points:
        known = by_spec.get(point.spec)
        if known is None or (point.finished and not known.finished):
            by_spec[point.spec] = point
    return by_spec


def structured_spec(base: TrialSpec, policy: str, stride: int) -> TrialSpec:
    """``base`` at budget 1.0 with block AC of ``policy`` every ``stride`` blocks (0: none)."""
    return base.replace(
        activation_memory_budget=1.0,
        block_ac_every=stride,
        block_ac_policy=policy if stride else "full",
    )


def structured_label(policy: str, stride: int) -> str:
    """The baseline label of a structured point."""
    return STRUCTURED_PREFIX + (f"{policy}-{stride}" if stride else "none")


def next_structured(
    search: SearchSpec,
    points: Sequence[Point],
    base: TrialSpec,
    policies: Sequence[str],
) -> tuple[str, TrialSpec] | None:
    """The next structured point to measure, or None when the map is complete (or waits for
    a point that is still running).

    For each policy, the strides are ordered from most to least checkpointing; a point that
    fits rules out the strides before it (they hold less memory and recompute more), a point
    over the limit (or out of memory, or crashed) those after it; the next point is the middle
    of what is left unknown, and while that one runs, the unknown stride nearest it (parallel
    workers map a policy at once). A configuration already measured, running or queued (a
    baseline, a settle probe) is never measured again.

    Args:
        search: the search (its space's strides).
        points: every trial of the study, finished or not.
        base: the configuration at the settled knobs, as given otherwise.
        policies: the block-AC policies still searched.
    """
    by_spec = by_spec_of(points)
    strides = ordered_strides(search)
    full_missing = len(strides)  # the op policy saves more than full: it misses where full does
    leanest: tuple[str, int] | None = None  # (policy, stride) of the leanest point over the limit
    waiting = False
    for policy in sorted(policies, key=lambda name: name != "full"):
        specs = [structured_spec(base, policy, stride) for stride in strides]
        fitting, missing = -1, len(specs) if policy == "full" else full_missing
        for index, spec in enumerate(specs):
            measured = by_spec.get(spec)
            if measured is None or not measured.finished:
                continue
            if measured.fits:
                fitting = max(fitting, index)
            else:
                missing = min(missing, index)
        if policy == "full":
            full_missing = missing
        over = by_spec.get(specs[missing]) if missing < len(specs) else None
        if leanest is None and over is not None and over.outcome != "crashed":
            leanest = (policy, strides[missing])  # measured over the limit (a crash: not that)
        if missing - fitting <= 1:
            continue  # this policy's boundary is mapped
        # the middle of what is left unknown; while it runs (workers in parallel), the other
        # strides left unknown, nearest the middle first, rather than the sampler's points (a
        # 2-GPU search of 8 workers never measured "none", the fastest that fit: issue 44)
        middle = (fitting + missing) // 2
        unknown = [i for i in range(fitting + 1, missing) if by_spec.get(specs[i]) is None]
        if not unknown:  # every one still running or queued
            waiting = True
            continue
        index = min(unknown, key=lambda i: (abs(i - middle), i))
        return structured_label(policy, strides[index]), specs[index]
    if waiting or leanest is None:
        return None
    return _offload_point(search, by_spec, base, *leanest)


def _offload_point(
    search: SearchSpec,
    by_spec: Mapping[TrialSpec, Point],
    base: TrialSpec,
    policy: str,
    stride: int,
) -> tuple[str, TrialSpec] | None:
    """With offload searched, the leanest structured point over the limit, offloading every
    block it can (`offload_every` at its smallest stride): the other way to fit it.

    Where even full block AC on every block is over the limit, only offload can fit, and a
    sampler spread over the space rarely draws it before the trials run out
    (benchmarks/results/README.md#offload-point); where a sparser stride is over, its
    offloading may cost less time than the next stride's recompute.
    """
    knob = KNOB_BY_NAME["offload_every"]
    every = sorted(k for k in search.space.values_of(knob) if k > 0)
    if not every or "offload_every" in search.space.fixed:
        return None
    spec = structured_spec(base, policy, stride).replace(offload_every=every[0])
    if not knob.relevant(spec) or spec in by_spec:
        return None
    return f"{structured_label(policy, stride)}-offload-{every[0]}", spec


def next_flip(
    search: SearchSpec, points: Sequence[Point], held: Mapping[str, Any], given: TrialSpec
) -> tuple[str, TrialSpec] | None:
    """The fastest finished point that fits, with one free choice that is not ``held``
    flipped (the probed value where it has the other, else the value as given); None when
    every such choice is held, flipped there already (measured, running or queued), flipped
    `MAX_FLIPS` times in the study, or nothing fits yet.

    The incumbent can change while parallel workers map block AC: a flip is taken at each new
    one, up to `MAX_FLIPS` a choice (a 2-GPU search of 8 workers flipped only once the map was
    complete, by when its 20 trials were spent on memory-edge points over the limit, and
    pinned op AC with AdamW as written, 3.5 % slower than with the fused one: issue 44).

    Args:
        search: the search (its free choices and the values as given).
        points: every trial of the study, finished or not.
        held: the settled choices (``{knob: value}``).
        given: the configuration as given (the unconstrained baseline's).
    """
    fitting = [p for p in points if p.finished and p.outcome == "ok" and p.fits]
    if not fitting:
        return None
    best = min(fitting, key=lambda p: p.step_time_ms or float("inf"))
    known = {p.spec for p in points}
    for knob, probed in _free_choices(search):
        label = FLIP_PREFIX + knob
        if knob in held or sum(p.label == label for p in points) >= MAX_FLIPS:
            continue
        current = getattr(best.spec, knob)
        other = probed if current != probed else getattr(given, knob)
        spec = best.spec.replace(**{knob: other})
        if other != current and spec not in known:
            return label, spec
    return None


def settled_attr(settlements: Sequence[Settlement]) -> dict[str, Any]:
    """The study attr of held choices."""
    return {s.knob: s.to_json_dict() for s in settlements}


def held_values(attr: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{knob: value}`` from the study attr (`SETTLED_ATTR`)."""
    return {knob: entry["value"] for knob, entry in (attr or {}).items()}


BATCH_PREFIX = "batch-"
"""Baseline label of a batch point: ``batch-none-4`` (budget 1.0), ``batch-full-4``."""


def next_batch_point(
    points: Sequence[Point], given: TrialSpec, sizes: Sequence[int], global_batch: int
) -> tuple[str, TrialSpec] | None:
    """The next point of the memory axis in batch (issue 46), what a batch finder returns:
    the largest micro-batch that fits at budget 1.0 (``given``: no block AC), and under full
    block AC on every block. Each walk starts at the given micro-batch (the baselines measure
    it) and goes up while a size fits, down while it does not, as Lightning's
    ``BatchSizeFinder`` grows and accelerate's ``find_executable_batch_size`` halves: the peak
    grows with the micro-batch, so a size above one that does not fit is never tried. None
    when both are found (or none fits), or a point of the walk is still running.

    Args:
        points: every trial of the study, finished or not.
        given: the configuration as given (budget 1.0, no block AC, its micro-batch).
        sizes: the micro-batches the search tries.
        global_batch: the rows of one optimizer step.
    """
    by_spec = {p.spec: p for p in points}
    ordered = sorted(sizes)
    start = given.micro_batch if given.micro_batch in ordered else ordered[-1]
    for name, base in (("none", given), ("full", given.replace(block_ac_every=1))):
        waiting, step = _batch_walk(by_spec, base, ordered, ordered.index(start), global_batch)
        if waiting:
            return None
        if step is not None:
            return f"{BATCH_PREFIX}{name}-{step.micro_batch}", step
    return None


def _batch_walk(
    by_spec: Mapping[TrialSpec, Point],
    base: TrialSpec,
    ordered: Sequence[int],
    index: int,
    global_batch: int,
) -> tuple[bool, TrialSpec | None]:
    """The walk of one configuration from ``ordered[index]``: ``(True, None)`` while a point
    of it runs, else ``(False, the next spec to measure)``, whose spec is None once the walk
    has found its largest fitting size (or that none fits)."""
    direction = 0  # +1 going up (the start fit), -1 going down
    while 0 <= index < len(ordered):
        spec = accumulated(base.replace(micro_batch=ordered[index]), global_batch)
        point = by_spec.get(spec)
        if point is None:
            return False, spec
        if not point.finished:
            return True, None
        fits = point.fits
        if direction == 0:
            direction = 1 if fits else -1
        elif (direction == 1) != fits:
            return False, None  # up: the first that does not fit; down: the first that does
        index += direction
    return False, None
