"""Merging the ranks of a sharded trial into one `TrialResult`, and the per-rank split.

Each rank writes its own ``RESULT.rank{r}.json``. The trial's figures are the ones that must
fit and the ones that set the pace: the largest peak of any rank (every metric, every phase)
and the slowest rank's step time. A trial in which some rank failed is ``oom`` if a rank ran
out of memory, else ``crashed``; the failing rank is the one that failed by itself, not one
whose collective broke because a peer went away (``collective``) or that the launcher stopped
after another's failure (``terminated``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from budgettune.trial.phases import merge_phases
from budgettune.trial.results import (
    PHASES,
    Measurement,
    RankFigures,
    TrialOutcome,
    TrialResult,
    read_result,
)

SECONDARY_STAGES = ("collective", "terminated")
"""`TrialResult.failed_stage` of a rank that failed because of another rank."""


def rank_result_path(result_path: str | os.PathLike[str], rank: int) -> Path:
    """``RESULT.json`` → ``RESULT.rank{r}.json`` (each rank's own file, next to the trial's)."""
    path = Path(result_path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def read_rank_results(
    result_path: str | os.PathLike[str], world_size: int
) -> dict[int, TrialResult | None]:
    """Every rank's result; None for a rank that wrote none (or an unreadable one)."""
    found: dict[int, TrialResult | None] = {}
    for rank in range(world_size):
        try:
            found[rank] = read_result(rank_result_path(result_path, rank))
        except (OSError, ValueError):
            found[rank] = None
    return found


def merge_measurements(measurements: Sequence[Measurement]) -> Measurement:
    """The largest peaks of all ranks and the slowest rank's step time (its p10/p90 too);
    loss and grad norm from the first (rank 0: the loss is the same computation on every
    rank, and the grad norm is global). Host memory is the sum of the ranks' (they share one
    host); the bytes offloaded per step, the largest rank's (each rank has its own link)."""
    slowest = max(measurements, key=lambda m: m.step_time_ms)
    phase_peaks = {p: max(m.phase_peak_bytes[p] for m in measurements) for p in PHASES}
    highest = max(measurements, key=lambda m: m.peak_allocated_bytes)
    return Measurement(
        peak_allocated_bytes=max(m.peak_allocated_bytes for m in measurements),
        peak_reserved_bytes=max(m.peak_reserved_bytes for m in measurements),
        peak_device_bytes=max(m.peak_device_bytes for m in measurements),
        steady_bytes=max(m.steady_bytes for m in measurements),
        phase_peak_bytes=phase_peaks,
        peak_phase=highest.peak_phase,
        step_time_ms=slowest.step_time_ms,
        step_time_p10_ms=slowest.step_time_p10_ms,
        step_time_p90_ms=slowest.step_time_p90_ms,
        compile_s=max(m.compile_s for m in measurements),
        loss=measurements[0].loss,
        grad_norm=measurements[0].grad_norm,
        host_peak_bytes=sum(m.host_peak_bytes for m in measurements),
        offload_bytes=max(m.offload_bytes for m in measurements),
    )


def _figures(rank: int, result: TrialResult | None, missing_error: str) -> RankFigures:
    if result is None:
        return RankFigures(rank=rank, outcome=TrialOutcome.CRASHED, error=missing_error)
    return RankFigures(
        rank=rank, outcome=result.outcome, measurement=result.measurement, error=result.error
    )


def _died(result: TrialResult | None) -> bool:
    return result is None or result.failed_stage == "died"


def _failed_at(result: TrialResult | None) -> float:
    return 0.0 if result is None else result.failed_at_s or float("inf")


def merge_rank_results(
    results: Mapping[int, TrialResult | None], *, launcher_error: str = ""
) -> TrialResult:
    """One `TrialResult` for a sharded trial from its ranks' results.

    Args:
        results: rank → its result (None: it wrote none).
        launcher_error: what the launcher said when it failed (exit code or signal), used when
            no rank says what went wrong.

    Returns:
        ``ok`` with the merged measurement when every rank measured; else ``oom``,
        ``non_finite`` or ``crashed`` with ``failed_rank`` and an error naming it.
    """
    world = len(results)
    missing = launcher_error or "the rank wrote no result"
    ranks = tuple(_figures(r, results[r], missing) for r in sorted(results))
    present = [results[r] for r in sorted(results) if results[r] is not None]
    info: dict[str, Any] = {}
    if present:
        first = present[0]
        assert first is not None
        info = {
            "device_name": first.device_name,
            "torch_version": first.torch_version,
            "cuda_version": first.cuda_version,
            "workload_fingerprint": first.workload_fingerprint,
            "model_changes": first.model_changes,  # every rank changes its model alike
            "dropout": first.dropout,
            "phases_s": merge_phases([r.phases_s for r in present if r is not None]),
            "cold_caches": any(r.cold_caches for r in present if r is not None),
        }
    common: dict[str, Any] = {"world_size": world, "ranks": ranks, **info}
    if all(f.outcome.is_feasible() and f.measurement is not None for f in ranks):
        measured = [f.measurement for f in ranks if f.measurement is not None]
        return TrialResult(
            outcome=TrialOutcome.OK, measurement=merge_measurements(measured), **common
        )
    failed = [(r, results[r]) for r in sorted(results) if not ranks[r].outcome.is_feasible()]
    primary = [
        (r, res) for r, res in failed if res is None or res.failed_stage not in SECONDARY_STAGES
    ]
    ooms = [(r, res) for r, res in primary if res is not None and res.outcome is TrialOutcome.OOM]
    # A rank that died without a word, then the rank whose failure was caught first (gloo
    # reports a peer that went away as a plain RuntimeError, after the peer's own failure).
    primary.sort(key=lambda item: (not _died(item[1]), _failed_at(item[1]), item[0]))
    chosen = (ooms or primary or failed)[0]
    rank, result = chosen
    outcome = TrialOutcome.OOM if ooms else TrialOutcome.CRASHED
    if result is not None and result.outcome in (TrialOutcome.TIMEOUT, TrialOutcome.NON_FINITE):
        outcome = result.outcome
    error = ranks[rank].error or missing
    others = [r for r, _ in failed if r != rank]
    tail = f"; rank(s) {', '.join(map(str, others))} stopped with it" if others else ""
    stage = "" if result is None else result.failed_stage
    return TrialResult(
        outcome=outcome,
        error=f"rank {rank} of {world}: {error}{tail}",
        failed_rank=rank,
        failed_stage="" if stage in SECONDARY_STAGES else stage,
        **common,
    )


def memory_split(ranks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The measured split of the largest rank: sharded state vs activations (bytes per rank).

    ``steady_bytes`` (parameters, gradients, optimizer state before the step: divided by the
    world size under FSDP2) and the rest of the peak (activations and temporaries: not
    divided). ``ranks`` are `RankFigures` measurements as JSON dicts.
    """
    largest = max(ranks, key=lambda m: int(m["peak_allocated_bytes"]))
    state = int(largest["steady_bytes"])
    peak = int(largest["peak_allocated_bytes"])
    return {
        "sharded_state_bytes": state,
        "activation_bytes": max(peak - state, 0),
        "peak_allocated_bytes": peak,
    }


def world_size_warning(
    *, pinned_world: int, running_world: int, split: Mapping[str, int] | None
) -> str:
    """What to tell a job started with another world size than the pin was measured with."""
    rerun = f"re-run `budgettune search --nproc-per-node {running_world}`"
    if not split:
        return (
            f"the pin was measured with world size {pinned_world}, this job runs "
            f"{running_world}: its per-rank memory differs; {rerun}"
        )
    state, acts = split["sharded_state_bytes"], split["activation_bytes"]
    expected = state * pinned_world / max(running_world, 1) + acts
    return (
        f"the pin was measured with world size {pinned_world}, this job runs {running_world}: "
        f"per rank the sharded state was {state / 1e9:.2f} GB (it scales with 1/world size) "
        f"and activations {acts / 1e9:.2f} GB (they do not), so expect about "
        f"{expected / 1e9:.2f} GB per rank, not the pinned {(state + acts) / 1e9:.2f} GB; "
        f"{rerun}"
    )


def per_rank_figures(results: Sequence[TrialResult], mem_metric: str) -> list[dict[str, Any]]:
    """Each rank's figures over fresh runs of one configuration (the pin's ``per_rank``): the
    worst peak on the metric and allocated, the steady (sharded state) bytes, the median
    step time."""
    by_rank: dict[int, list[Measurement]] = {}
    for result in results:
        for figures in result.ranks:
            if figures.measurement is not None:
                by_rank.setdefault(figures.rank, []).append(figures.measurement)
    rows = []
    for rank in sorted(by_rank):
        runs = by_rank[rank]
        times = sorted(m.step_time_ms for m in runs)
        rows.append(
            {
                "rank": rank,
                "peak_worst_bytes": max(m.peak_bytes(mem_metric) for m in runs),
                "peak_allocated_bytes": max(m.peak_allocated_bytes for m in runs),
                "steady_bytes": max(m.steady_bytes for m in runs),
                "step_time_ms": times[len(times) // 2],
            }
        )
    return rows
