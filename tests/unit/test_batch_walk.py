"""The batch finder's walk in the opening (issue 46): from the given micro-batch, up while a size
fits, down while it does not, at budget 1.0 and then under full block AC; never a size above
one that does not fit (on an H200 a search spent two of 16 trials on budget 1.0 at 32 and 16
rows, 78 and 49 GB against a 26 GB limit, after 8 rows had not fit)."""

from __future__ import annotations

from budgettune.study.batch import accumulated
from budgettune.study.structured import Point, next_batch_point
from budgettune.trial.spec import TrialSpec

SIZES = (1, 2, 4, 8, 16, 32)
GIVEN = accumulated(TrialSpec(micro_batch=8), 32)


def _at(size: int, *, full: bool = False) -> TrialSpec:
    base = GIVEN.replace(block_ac_every=1) if full else GIVEN
    return accumulated(base.replace(micro_batch=size), 32)


def _done(spec: TrialSpec, fits: bool) -> Point:
    return Point(label=None, spec=spec, finished=True, outcome="ok", fits=fits)


def _next(points: list[Point], given: TrialSpec = GIVEN) -> str | None:
    step = next_batch_point(points, given, SIZES, 32)
    if step is None:
        return None
    label, spec = step
    assert spec.micro_batch * spec.accum_steps == 32  # every point is one global batch
    assert label.endswith(f"-{spec.micro_batch}")
    return label


def test_the_walk_goes_down_from_a_given_batch_that_does_not_fit_and_never_above_it() -> None:
    points = [_done(_at(8), False), _done(_at(8, full=True), True)]
    assert _next(points) == "batch-none-4"
    points.append(Point(label="batch-none-4", spec=_at(4), finished=False))
    assert _next(points) is None  # the walk waits for the point it measures
    points[-1] = _done(_at(4), False)
    assert _next(points) == "batch-none-2"
    points.append(_done(_at(2), True))  # the largest that fits at budget 1.0: 2
    # full block AC fit at 8 (the baseline): up from there
    assert _next(points) == "batch-full-16"
    points.append(_done(_at(16, full=True), True))
    assert _next(points) == "batch-full-32"
    points.append(_done(_at(32, full=True), False))
    assert _next(points) is None  # both found: the largest under full AC is 16
    tried = {p.spec.micro_batch for p in points if p.spec.block_ac_every == 0}
    assert tried == {8, 4, 2}  # 16 and 32 at budget 1.0: never, 8 did not fit


def test_the_walk_goes_up_from_a_given_batch_that_fits() -> None:
    points = [_done(_at(8), True)]
    assert _next(points) == "batch-none-16"
    points.append(_done(_at(16), False))
    # the largest at budget 1.0 is 8; full AC starts at 8 too (its baseline not yet run here)
    assert _next(points) == "batch-full-8"


def test_a_given_batch_outside_the_list_starts_at_the_largest_and_walks_down() -> None:
    given = accumulated(TrialSpec(micro_batch=3), 30)
    step = next_batch_point([], given, (2, 6, 10), 30)
    assert step is not None and step[0] == "batch-none-10"


def test_nothing_fits_down_to_the_smallest_ends_that_walk() -> None:
    points = [_done(_at(size), False) for size in (8, 4, 2, 1)]
    points.append(_done(_at(8, full=True), False))
    assert _next(points) == "batch-full-4"
    points += [_done(_at(size, full=True), False) for size in (4, 2, 1)]
    assert _next(points) is None
