"""Crash memory: a knob value that crashes structurally is not proposed again in the study.

A crashed trial teaches TPE nothing (it has no value and no constraint), so without this the
sampler keeps proposing what crashed: a search of a `transformers` GPT-2 lost 7 of 12 trials
to block AC that way. Rules, read from the trials' user attrs (so every worker of a study
agrees, and a resumed study remembers):

- **Twice the same way.** Two crashed trials whose errors have the same shape (exception type
  and message with numbers and addresses stripped) share a knob value no trial that ran (ok,
  OOM, numerics mismatch or a non-finite loss) had: that value is excluded. When several
  qualify, the one held by most of those crashes, then the first in `KNOBS` order (coarse
  before fine: block AC as a whole before one stride or policy), is blamed; another repeat
  blames the next.
- **Its baseline crashed.** The full block-AC baseline crashed while the unconstrained one
  ran, and no block-AC trial ran: block AC is excluded (one trial lost).

A crash whose shape does not repeat (a flaky node) excludes nothing; such trials are retried
as before. A trial whose run folder or disk failed it is no crash at all: the launcher raises
for it (`TrialInfrastructureError`), it gets no outcome, and it is re-run. Exclusions narrow
the `SearchSpace` the way ``--fix`` and the value lists do: the value is dropped from its
list, and a list left with one value is no longer suggested. A value the user fixed, or the
last value of a list, is never excluded.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import optuna

from budgettune.errors import first_line
from budgettune.storage.trials import (
    EXCLUDED_ATTR,
    FULL_AC,
    UNCONSTRAINED,
    describe_exclusion,
)
from budgettune.storage.user_attrs import TrialRecord
from budgettune.study.space import LISTED, SearchSpace
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec

RAN = tuple(outcome.value for outcome in TrialOutcome if outcome.ran())
"""Outcomes that prove a configuration runs (a crash did not happen): ok, oom, numerics
mismatch, non-finite loss. A trial failed by its run folder or disk, or interrupted, has no
outcome at all and proves nothing either way."""
_CHOICES = tuple(k for k in LISTED if k.sampled == "choice")
KNOBS = (
    "block_ac",
    "block_ac_policy",
    "block_ac_every",
    *(k.name for k in _CHOICES if k.name not in ("block_ac_policy", "block_ac_every")),
)
"""Knobs a crash can be blamed on, coarse first (``block_ac`` is block AC on at all), then
every other knob the space lists values of, in `TrialSpec`'s order."""
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(\.\d+)?")


def error_shape(error: str) -> str:
    """An error's shape: its first line with numbers and addresses replaced by ``N``."""
    return _NUMBERS.sub("N", first_line(error))


def knob_values(spec: Mapping[str, Any] | TrialSpec) -> list[tuple[str, Any]]:
    """The (knob, value) pairs a crash of ``spec`` (a `TrialSpec`, or its JSON dict) may be
    blamed on: block AC as a whole, then each listed knob where it is relevant."""
    trial_spec = spec if isinstance(spec, TrialSpec) else TrialSpec.from_json_dict(spec)
    values: list[tuple[str, Any]] = []
    if trial_spec.block_ac_every > 0:
        values.append(("block_ac", "on"))
    for name in KNOBS[1:]:
        k = KNOB_BY_NAME[name]
        if name == "block_ac_every" and trial_spec.block_ac_every == 0:
            continue
        if k.relevant(trial_spec):
            values.append((name, getattr(trial_spec, name)))
    return values


def _entry(knob: str, value: Any, reason: str, error: str, trials: Sequence[int]) -> dict:
    return {
        "knob": knob,
        "value": value,
        "reason": reason,
        "error": error[:300],
        "trials": sorted(trials),
    }


def find_exclusions(
    trials: Iterable[tuple[int, Mapping[str, Any]]], excluded: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The exclusions the study's trials call for that ``excluded`` does not hold yet.

    Args:
        trials: ``(number, user_attrs)`` of the study's trials (running ones included: the
            objective sets a crashed trial's attrs before Optuna marks it failed).
        excluded: the study's current exclusions.

    Returns:
        New exclusion entries (see `storage.trials.EXCLUDED_ATTR`), at most one per shape.
    """
    known = {(e["knob"], e["value"]) for e in excluded}
    ran: set[tuple[str, Any]] = set()
    crashes: dict[str, list[tuple[int, TrialRecord, TrialSpec]]] = defaultdict(list)
    baselines: dict[str, tuple[int, TrialRecord]] = {}
    for number, attrs in trials:
        record = TrialRecord.from_attrs(attrs)
        outcome, spec = record.stored_outcome, record.spec
        if outcome is None or spec is None:
            continue
        if record.baseline in (UNCONSTRAINED, FULL_AC):
            baselines[record.baseline] = (number, record)
        if outcome in RAN:
            ran.update(knob_values(spec))
        elif outcome == "crashed":
            crashes[error_shape(record.error)].append((number, record, spec))
    new: list[dict[str, Any]] = []

    def blameable(pair: tuple[str, Any]) -> bool:
        return (
            pair not in ran
            and pair not in known
            and all((e["knob"], e["value"]) != pair for e in new)
        )

    full_ac = baselines.get(FULL_AC)
    unconstrained = baselines.get(UNCONSTRAINED)
    if (
        full_ac is not None
        and full_ac[1].stored_outcome == "crashed"
        and unconstrained is not None
        and unconstrained[1].stored_outcome in RAN
        and blameable(("block_ac", "on"))
    ):
        new.append(
            _entry("block_ac", "on", "its baseline crashed", full_ac[1].error, [full_ac[0]])
        )
    for shape, group in crashes.items():
        if len(group) < 2 or not shape:
            continue
        counts: Counter[tuple[str, Any]] = Counter()
        for _, _, spec in group:
            counts.update(set(knob_values(spec)))
        candidates = [pair for pair, n in counts.items() if n >= 2 and blameable(pair)]
        if not candidates:
            continue
        pair = min(candidates, key=lambda p: (-counts[p], KNOBS.index(p[0])))
        holders = [n for n, _, spec in group if pair in knob_values(spec)]
        error = group[-1][1].error
        new.append(_entry(*pair, f"crashed the same way {len(holders)} times", error, holders))
    return new


def remember_crashes(study: optuna.Study, notice: Callable[[str], None]) -> None:
    """Add the exclusions the study's trials call for to its `EXCLUDED_ATTR`; say each once."""
    excluded = list(study.user_attrs.get(EXCLUDED_ATTR, []))
    trials = [(t.number, t.user_attrs) for t in study.get_trials(deepcopy=False)]
    new = find_exclusions(trials, excluded)
    if new:
        study.set_user_attr(EXCLUDED_ATTR, excluded + new)
        for entry in new:
            notice(f"{describe_exclusion(entry)}; not proposed again")


def narrow(space: SearchSpace, excluded: Sequence[Mapping[str, Any]]) -> SearchSpace:
    """``space`` without the excluded values (never a fixed knob, never a list's last value)."""
    changes: dict[str, tuple] = {}
    for entry in excluded:
        knob, value = entry.get("knob"), entry.get("value")
        if knob in space.fixed or (knob == "block_ac" and "block_ac_every" in space.fixed):
            continue
        if knob in ("block_ac", "block_ac_every"):
            field, current = "block_ac_every", changes.get("block_ac_every", space.block_ac_every)
            kept = tuple(k for k in current if (k == 0 if knob == "block_ac" else k != value))
        elif isinstance(knob, str) and knob in KNOB_BY_NAME and KNOB_BY_NAME[knob] in _CHOICES:
            field = KNOB_BY_NAME[knob].plural
            current = changes.get(field, getattr(space, field))
            kept = tuple(v for v in current if v != value)
        else:
            continue
        if kept:
            changes[field] = kept
    return space.replace(**changes) if changes else space
