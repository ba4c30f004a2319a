"""Re-verification sized by the noise it must separate: the fastest fitting trials re-measured
in fresh processes, in rounds, until one is ahead of the rest by more than the noise.

Round 1 measures each of the ``--top-k`` fastest fitting candidates once (in parallel over the
search's GPU slots). A later round re-measures only the leader and the candidates within
twice the noise of it (`contenders`); the rounds stop when the leader stands alone and its
noise is small (`SETTLED_NOISE`), or after ``--reverify-runs`` of them. The noise is read
from the runs themselves (`noises_of`): how far each configuration's fresh runs fall from its
trial and around their median; two candidates are compared with the larger of their own two,
and at least the median of every candidate's (the host's) and `MIN_NOISE` (`Noise.between`).
A clear leader on quiet runs is thus pinned on one fresh run, two candidates within 1 % on up
to ``--reverify-runs`` each (issue 44: three runs of every candidate were half a search's
wall). Why per pair: a low-budget point compiles to one of two programs 10 % apart in step
time (`benchmarks/results/h200-probe-2026-11-29/`), and read as the noise of every comparison,
its runs kept a candidate 6 % behind the leader in two more rounds (30 s of a 377-s one-GPU
search; replayed on the seven committed one-GPU searches of 2026-11-29, that is the one round
this saves, and every pin stays the same).

The pin must state what a job on a fresh host peaks at, compile caches empty (on a cold cache
autotuning and inductor's first-run state reserved 1.3-2 % more): the winner has one run that
started with empty caches of its own (round 1's run of the fastest trial is one; another
winner gets one more run, cold), and its worst peak, which the limit is checked against,
includes it. When no candidate of the batch qualifies (a re-measured peak over the limit),
the next ones are re-measured one by one, up to `MAX_CANDIDATES`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from budgettune.pinning import Candidate, qualified
from budgettune.study.fresh import FreshJob
from budgettune.study.pin_steps import PinSteps
from budgettune.trial.results import TrialResult
from budgettune.units import format_bytes, format_percent

MAX_CANDIDATES = 8
"""At most this many feasible configurations are re-measured (or ``--top-k``, if larger)
before the search gives up with exit 3."""
MIN_NOISE = 0.005
"""The least relative step-time noise assumed between two fresh processes (0.5 %)."""
SETTLED_NOISE = 0.03
"""A leader standing alone is pinned once the noise is at most this (3 %): noisier runs (a
busy CPU host: 28 % between a trial and its fresh run was seen) take every round, so that the
pin's figures are medians, not one lucky or unlucky run."""

Reverified = dict[int, list[TrialResult]]


class Noise:
    """The relative step-time noise of each re-measured candidate (by trial number), and what
    it means for comparing two of them (`between`)."""

    def __init__(self, own: Mapping[int, float]) -> None:
        self.own = dict(own)
        self.typical = max(MIN_NOISE, statistics.median(own.values()) if own else 0.0)
        """The median of the candidates' own noise: the host's, whatever one configuration's
        runs do."""

    def between(self, a: Candidate, b: Candidate) -> float:
        """The noise between the medians of ``a`` and ``b`` (``b`` may be ``a``: its own)."""
        return max(
            self.typical, self.own.get(a.trial_number, 0.0), self.own.get(b.trial_number, 0.0)
        )

    @property
    def worst(self) -> float:
        """The largest of them (`noise_of`)."""
        return max([self.typical, *self.own.values()])


def noises_of(
    candidates: Sequence[Candidate], reverified: Mapping[int, Sequence[TrialResult]]
) -> Noise:
    """The relative step-time noise the runs show, as it bears on comparing medians: per
    candidate with fresh runs, how far their median falls from its own trial, and how far they
    spread around that median, the farthest left out where there are three or more (one
    outlier moves a median of three no more than it moves this).

    Issue 44: on four GPUs one crowded run came 7.9 % off its two siblings (within 0.1 % of
    each other), and with the largest gap as the noise the search took a configuration 6 %
    faster for a tie and pinned the slower full block AC.
    """
    own = {}
    for candidate in candidates:
        times = [
            r.measurement.step_time_ms
            for r in reverified.get(candidate.trial_number, ())
            if r.measurement is not None
        ]
        if not times:
            continue
        middle = statistics.median(times)
        spread = sorted(_gap(ms, middle) for ms in times)
        gaps = [_gap(candidate.step_time_ms, middle), *spread[: -1 if len(spread) >= 3 else None]]
        own[candidate.trial_number] = max(gaps)
    return Noise(own)


def noise_of(
    candidates: Sequence[Candidate], reverified: Mapping[int, Sequence[TrialResult]]
) -> float:
    """The largest relative step-time noise of any candidate's runs (`noises_of`), at least
    `MIN_NOISE`: what the search tells of the host (`pin.noise_notice`)."""
    return noises_of(candidates, reverified).worst


def _gap(a: float, b: float) -> float:
    low = min(a, b)
    return abs(a - b) / low if low > 0 else 0.0


def contenders(
    ranked: Sequence[tuple[float, Candidate, list[TrialResult]]], noise: Noise
) -> list[Candidate]:
    """The leader of ``ranked`` (qualified, fastest first) and every candidate whose median
    is within twice the noise between them of the leader's: those the runs so far cannot
    tell apart."""
    if not ranked:
        return []
    leader_ms, leader, _ = ranked[0]
    return [
        candidate
        for ms, candidate, _ in ranked
        if ms <= leader_ms * (1.0 + 2.0 * noise.between(leader, candidate))
    ]


def candidate_job(candidate: Candidate, *, cold: bool = False) -> FreshJob:
    """The fresh runs of a candidate, stored against its trial (``reverify-<trial>-<n>``)."""
    return FreshJob(
        spec=candidate.spec,
        number=candidate.trial_number,
        run_name=f"reverify-{candidate.trial_number:04d}",
        phase=f"re-verifying trial {candidate.trial_number}",
        cold=cold,
    )


def first_round_runs(wanted: int, slots: int, pool: int) -> int:
    """Runs of each of ``pool`` candidates that a round of ``slots`` fresh-run slots holds (at
    least one, at most ``wanted``)."""
    return max(1, min(wanted, slots // max(1, pool)))


def _ranked(
    searcher: PinSteps, tried: Sequence[Candidate], reverified: Reverified
) -> list[tuple[float, Candidate, list[TrialResult]]]:
    search = searcher.search
    return qualified(
        tried,
        reverified,
        limit_bytes=search.max_mem_bytes,
        mem_metric=search.mem_metric,
        margin=search.margin,
        host_limit_bytes=search.host_limit_bytes,
        rows=search.ranking_rows,
    )


def _rounds(
    searcher: PinSteps,
    batch: Sequence[Candidate],
    tried: Sequence[Candidate],
    reverified: Reverified,
    *,
    first: bool,
    alongside: Sequence[FreshJob] = (),
) -> None:
    """Re-measure ``batch`` in rounds until its leader stands alone (`contenders`).

    Where the search has more fresh-run slots than the pool has candidates, rounds go out
    together (as many as the slots hold, up to ``--reverify-runs``): a round costs a compile's
    wall whatever it holds (45-55 s for full block AC), and three rounds one after another were
    five minutes of a 4-GPU search of 16 slots (issue 44). The first batch's first runs are
    then all cold starts (in parallel, at no extra wall), so whichever wins has its cold run.
    ``alongside`` (references re-measured for the report only) join the first round whose
    slots still hold them, with every run that round asks of a candidate (on two H200s the
    over-limit baseline's 3 runs went out after the last round, 17 s of a 304 s search, with
    6 of 8 slots free in that round); their runs are stored, and counted when the report asks
    for them. Once in, they keep pace with the pool in each later round that has room (on one
    H200 the baseline's two more runs went out after a round of two, 14 s of a 246 s search).
    """
    pool = list(batch)
    wanted = searcher.search.reverify_runs
    slots = max(1, searcher.fresh_slots)
    runs = 0
    waiting = list(alongside)
    joined: dict[FreshJob, int] = {}  # those that went out in a round: the runs they have
    while runs < wanted:
        at_once = first_round_runs(wanted - runs, slots, len(pool))
        # the fastest trial's first fresh run is a cold start (most often it is the winner);
        # every candidate's, when they all go out at once
        cold = [first and runs == 0 and (i == 0 or len(pool) <= slots) for i in range(len(pool))]
        jobs = [candidate_job(c, cold=k) for c, k in zip(pool, cold, strict=True)]
        runs += at_once
        # the new runs this round: at_once of each candidate, all of a reference's
        room = len(pool) * at_once + len(waiting) * runs <= slots
        extra, waiting = (waiting, []) if room else ([], waiting)
        behind = sum(runs - had for had in joined.values())  # the runs keeping pace takes
        pace = list(joined) if len(pool) * at_once + behind <= slots else []
        joined.update(dict.fromkeys([*extra, *pace], runs))
        measured = searcher.fresh_batch([*jobs, *extra, *pace], runs=runs)
        for candidate, results in zip(pool, measured, strict=False):
            reverified[candidate.trial_number] = results
        ranked = _ranked(searcher, tried, reverified)
        noise = noises_of(tried, reverified)
        pool = [c for c in contenders(ranked, noise) if c in batch]
        if not pool or (len(pool) == 1 and noise.between(pool[0], pool[0]) <= SETTLED_NOISE):
            return


def lightest_of_the_fastest(
    ranked: Sequence[tuple[float, Candidate, list[TrialResult]]], noise: Noise, mem_metric: str
) -> tuple[float, Candidate, list[TrialResult]]:
    """The pick of ``ranked`` (qualified, fastest first): of those whose median is within the
    noise between them of the fastest's, which the runs cannot tell apart, the one with the
    lowest worst peak (issue 45: two configurations of the same speed, the lighter one is
    pinned)."""
    leader_ms, leader, _ = ranked[0]
    tied = [
        entry
        for entry in ranked
        if entry[0] <= leader_ms * (1.0 + noise.between(leader, entry[1]))
    ]

    def worst_peak(entry: tuple[float, Candidate, list[TrialResult]]) -> int:
        return max(r.measurement.peak_bytes(mem_metric) for r in entry[2] if r.measurement)

    return min(tied, key=lambda entry: (worst_peak(entry), entry[0]))


def _with_cold_run(
    searcher: PinSteps, tried: Sequence[Candidate], reverified: Reverified
) -> tuple[Candidate, list[TrialResult]] | None:
    """The pick (`lightest_of_the_fastest`) among the qualifying candidates, once it has a
    cold run (one is added to each pick that lacks one, until a pick qualifies with it); None
    when none qualifies."""
    while True:
        ranked = _ranked(searcher, tried, reverified)
        if not ranked:
            return None
        noise = noises_of(tried, reverified)
        _, leader, runs = lightest_of_the_fastest(ranked, noise, searcher.search.mem_metric)
        if any(r.cold_caches for r in runs) or not searcher.search.compile_cache:
            return leader, runs
        [more] = searcher.fresh_batch([candidate_job(leader, cold=True)], runs=len(runs) + 1)
        reverified[leader.trial_number] = more


def reverify_until_one_fits(
    searcher: PinSteps,
    candidates: Sequence[Candidate],
    references: Sequence[Candidate] = (),
    *,
    alongside: Sequence[FreshJob] = (),
) -> tuple[tuple[Candidate, list[TrialResult]], dict[int, list[TrialResult]]] | None:
    """Re-measure candidates (fastest first) until one qualifies; None when none does.

    The top-k go out as one batch (in parallel over the search's GPUs), in rounds, then one
    at a time. ``references`` (the fitting references among the candidates: full block AC,
    op SAC, budget 1.0) join the first batch wherever their trials ranked, so the pin is
    chosen from fresh runs of the same rounds as theirs and is never one a reference beats
    (issue 45: one fresh run each, noise pinned budget 0.34 on full AC 3.1 % slower than
    full AC alone).

    Returns:
        The winner with its runs, and every re-measurement made (by trial number).
    """
    search = searcher.search
    bound = min(max(search.top_k, MAX_CANDIDATES), len(candidates))
    reverified: Reverified = {}
    tried: list[Candidate] = []
    index = 0
    while index < bound:
        ahead = list(candidates[index : max(index + 1, min(search.top_k, bound))])
        index += len(ahead)
        batch = [c for c in ahead if c not in tried]
        if not tried:
            batch += [c for c in references if c not in batch]
        if not batch:
            continue  # a reference, measured in the first batch already
        if tried:
            searcher.observer.notice(
                f"none of the {len(tried)} fastest fitting trials held under "
                f"{format_bytes(search.max_mem_bytes)} with the "
                f"{format_percent(search.margin)} margin "
                + (
                    "(and their host memory within --max-host-mem) "
                    if search.offload_searched
                    else ""
                )
                + f"when re-measured; trying trial {batch[0].trial_number} "
                f"({index}/{bound}, "
                f"{batch[0].step_time_ms:.1f} ms, {format_bytes(batch[0].peak_bytes)})"
            )
        first = not tried
        tried.extend(batch)
        joining = alongside if first else ()
        _rounds(searcher, batch, tried, reverified, first=first, alongside=joining)
        chosen = _with_cold_run(searcher, tried, reverified)
        if chosen is not None:
            return chosen, reverified
    return None
