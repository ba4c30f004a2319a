"""The structured opening in a running study (`search.structured` decides; this reads the
study and acts): hold the free choices its settle probes decided, and queue its next
structured point, then its flips, and its memory-edge points. Called under the claim lock,
before a worker asks for its next trial, so two workers never queue the same point; the
decisions use what finished, and the running and queued points only so as not to ask for
them again (or, at the memory edge, to take the half above one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from budgettune.storage.trials import FULL_AC, record_of
from budgettune.storage.user_attrs import EXCLUDED_ATTR, SETTLED_ATTR, TARGET_ATTR
from budgettune.study.crash_memory import narrow
from budgettune.study.edge import next_edge
from budgettune.study.opening import enqueue_baseline
from budgettune.study.space import SearchSpace
from budgettune.study.spec import SearchSpec
from budgettune.study.structured import (
    SETTLE_PREFIX,
    Point,
    held_values,
    next_batch_point,
    next_flip,
    next_structured,
    settle,
    settled_attr,
    wants_structured_opening,
)
from budgettune.study.study import as_given
from budgettune.trial.spec import KNOB_BY_NAME

_STATE = optuna.trial.TrialState


def points_of(
    trials: Sequence[optuna.trial.FrozenTrial], mem_metric: str, rows: int = 0
) -> list[Point]:
    """The study's trials as the opening sees them: measured ones with their figures (step
    times scaled to ``rows`` rows, as the search ranks them: `TrialSpec.ranked_ms`), queued
    and running ones with the configuration they will measure (sampled ones only once
    measured)."""
    points = []
    for trial in trials:
        record = record_of(trial)
        spec = record.spec or record.enqueued_spec
        if spec is None or (trial.state is _STATE.FAIL and not record.finished):
            continue  # a sampled trial not yet measured, or one failed before it ran
        finished = record.finished and trial.state.is_finished()
        points.append(
            Point(
                label=record.baseline,
                spec=spec,
                finished=finished,
                outcome=record.stored_outcome if finished else None,
                peak_bytes=record.peak_bytes(mem_metric),
                step_time_ms=None
                if record.step_time_ms is None
                else spec.ranked_ms(record.step_time_ms, rows),
                fits=None if record.violation_bytes is None else record.fits(),
            )
        )
    return points


def held(study_attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The free choices the study holds (`SETTLED_ATTR`)."""
    return held_values(study_attrs.get(SETTLED_ATTR))


def sampling_space(search: SearchSpec, study_attrs: Mapping[str, Any]) -> SearchSpace:
    """The space the sampler draws from: without the values crashes excluded, with the free
    choices the opening settled held fixed."""
    space = narrow(search.space, study_attrs.get(EXCLUDED_ATTR, []))
    kept = held(study_attrs)
    return space.replace(fixed={**space.fixed, **kept}) if kept else space


def plan_opening(study: optuna.Study, search: SearchSpec, notice: Callable[[str], None]) -> None:
    """Queue the batch finder's next point (several micro-batches searched), else record newly
    settled choices (and say so), then queue the next structured point.

    Nothing is queued while trials wait in the queue or a settle probe (or the full-AC
    reference) has no result yet: the next point depends on them.
    """
    trials = study.get_trials(deepcopy=False)
    sizes = search.space.values_of(KNOB_BY_NAME["micro_batch"])
    if len(sizes) > 1 and not any(t.state is _STATE.WAITING for t in trials):
        step = next_batch_point(
            points_of(trials, search.mem_metric, search.ranking_rows),
            as_given(search),
            sizes,
            search.global_batch,
        )
        if step is not None:  # the batch finder's points before the structured opening
            enqueue_baseline(study, search, *step)
            return
    if not wants_structured_opening(search, study.user_attrs.get(TARGET_ATTR)):
        return
    points = points_of(trials, search.mem_metric, search.ranking_rows)
    settled = {s.knob: s for s in settle(points, FULL_AC)}
    known = held(study.user_attrs)
    new = [s for knob, s in settled.items() if knob not in known]
    if new:
        stored = dict(study.user_attrs.get(SETTLED_ATTR) or {})
        stored.update(settled_attr(new))
        study.set_user_attr(SETTLED_ATTR, stored)
        for entry in new:
            notice(f"holding {entry.knob}={entry.value!r} for the study: {entry.reason}")
    if any(t.state is _STATE.WAITING for t in trials):
        return
    if any(not p.finished for p in points if (p.label or "").startswith(SETTLE_PREFIX)):
        return
    if not any(p.finished for p in points if p.label == FULL_AC):
        return
    attrs = study.user_attrs  # read from the storage once, the settlements above included
    holding = held(attrs)
    given = as_given(search)
    base = given.replace(**holding)
    policies = sampling_space(search, attrs).block_ac_policies
    step = next_structured(search, points, base, policies)
    if step is None:  # no structured point to queue now: the unsettled free choices, at the
        step = next_flip(search, points, holding, given)  # fastest point that fits so far
    if step is None:  # nothing else to queue now: the budget that fits at the memory edge
        target = int(attrs.get(TARGET_ATTR) or search.num_trials)
        step = next_edge(search, points, base, policies, target)
    if step is not None:
        label, spec = step
        enqueue_baseline(study, search, label, spec)
