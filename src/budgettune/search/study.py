"""What a study is made of: its name and attrs, its sampler and constraint, its baselines,
the user attrs of a measured trial, and the events a search reports to its observer.
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from budgettune.search.spec import STUDY_NAME_PATTERN, SearchSpec
from budgettune.search.structured import settle_probes, wants_structured_opening
from budgettune.storage.trials import FULL_AC, OP_SAC, UNCONSTRAINED
from budgettune.trial.results import RankFigures, TrialResult
from budgettune.trial.spec import EXPANDABLE, TrialSpec

SEARCH_ATTR = "search"
"""Study user attr: what must stay the same when the study is resumed (`study_attrs`)."""
SPEC_ATTR = "search_spec"
"""Study user attr: the whole `SearchSpec` (JSON, no storage URL), read by workers."""
WORKER_ATTR = "worker"
"""Trial user attr: ``host:device`` of the worker that ran it (throughput per worker)."""
HEARTBEAT_ATTR = "heartbeat_s"
"""Study user attr: the one trial-heartbeat interval of every process that runs its trials
(a worker's stale-trial check must not fail a trial whose process beats more slowly)."""

HIGH_BUDGET, HIGH_BUDGET_RETRY = "budget-0.8", "budget-0.8-as-given"
"""Baseline labels of the high-budget probe (`baseline_specs`) and of its retry at the user's
own values when the probe crashed (`high_budget_retry`)."""
HIGH_BUDGET_MIN_TRIALS = 10
"""From this many trials a study opens with budget 0.8 as well (`baseline_specs`): the
opening then leaves the sampler at least half of them (5 in a sharded study, which
opens with torchtitan's op SAC too)."""


class TrialFailed(Exception):
    """Raised inside the objective for a crashed or timed-out trial: Optuna marks it FAIL."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialEvent:
    """What the progress display gets after each trial."""

    number: int
    """Optuna trial number."""
    done: int
    """Trials finished in this invocation."""
    total: int
    """Trials this invocation will run."""
    spec: TrialSpec
    """The configuration measured."""
    result: TrialResult
    """Its result (numerics already checked)."""
    best_ms: float | None
    """Fastest feasible step time so far in the study."""
    fits: bool | None = None
    """Whether it fits the limit with the margin; None when it did not finish (crash, timeout)."""
    mem_metric: str = "device"
    """The metric the limit is on: the peak the progress line shows."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOutcome:
    """What a finished search produced."""

    study_name: str
    """The study."""
    storage_url: str
    """Where it is stored (password masked)."""
    trials_run: int
    """Trials finished by this invocation (by its workers, with ``--gpus``)."""
    pin: dict[str, Any]
    """The pinned config document (schema version 1)."""


def study_attrs(search: SearchSpec) -> dict[str, Any]:
    """What must stay the same when a study is resumed."""
    return {
        "workload": search.workload,
        "workload_options": dict(search.workload_options),
        "max_mem_bytes": search.max_mem_bytes,
        "mem_metric": search.mem_metric,
        "margin": search.margin,
        # a study of one rank per trial keeps the attrs it had before sharded trials existed
        **({"nproc_per_node": search.nproc_per_node} if search.is_sharded else {}),
    }


def default_study_name(
    workload: str,
    options: dict[str, Any],
    device: str,
    max_mem_bytes: int,
    metric: str,
    *,
    nproc_per_node: int = 1,
) -> str:
    """A stable name, so re-running the same command resumes the same study.

    Characters a study name may not hold (`check_study_name`: it becomes a folder) become
    ``-``; a name too long is cut and ends with a digest of the whole, so it stays distinct.
    """
    name = workload.split(":", 1)[-1] if workload.startswith("builtin:") else workload
    if workload.startswith("hf:"):
        name = "hf-" + Path(workload.split(":", 1)[1].rstrip("/")).name
    name = Path(name.split(":", 1)[0]).stem if ".py" in name else name.replace(":", "-")
    extra = "".join(f"-{k}{v}" for k, v in sorted(options.items()))
    ranks = f"-x{nproc_per_node}" if nproc_per_node > 1 else ""
    full = f"{name}{extra}-{device.split(':')[0]}-{max_mem_bytes / 1e6:.0f}MB-{metric}{ranks}"
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", full).lstrip(".-") or "study"
    if STUDY_NAME_PATTERN.match(safe):
        return safe
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{safe[:180]}-{digest}"


def make_sampler(search: SearchSpec) -> optuna.samplers.BaseSampler:
    """TPE with Optuna's constraint support and the constant liar for parallel workers."""
    with warnings.catch_warnings():
        # `group` is experimental, `warn_independent_sampling` and `constraints_func` are
        # deprecated in Optuna 5.0 but still the documented way; say so once, not every run.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return optuna.samplers.TPESampler(
            seed=search.sampler_seed,
            n_startup_trials=max(3, min(8, search.num_trials // 3)),
            multivariate=True,
            group=True,
            constant_liar=True,
            constraints_func=constraints_of,
            warn_independent_sampling=False,
        )


def constraints_of(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    """Optuna constraint: ``peak × (1 + margin) − limit`` (≤ 0 fits), stored by the objective."""
    return trial.user_attrs.get("constraint", [math.inf])


def baseline_specs(search: SearchSpec) -> list[tuple[str, TrialSpec]]:
    """The configurations every study measures first.

    ``unconstrained`` (compile at budget 1.0, optimizer as written unless fixed) is the
    reference for slowdown and numerics; block AC every 1 and budget 0.5 are the usual hand
    picks. A study long enough for the structured opening (`search.structured`) also
    measures its settle probes here; its structured points follow as results come in.

    A study of at least `HIGH_BUDGET_MIN_TRIALS` trials also opens with budget 0.8, at the
    searched knobs' leanest settings (`_leanest`):
    the budget->peak map is not monotone, and 0.5 is often the worse of the two on memory
    *and* time, so when 1.0 and 0.5 both miss the limit the sampler would otherwise take the
    whole high-budget range for infeasible (benchmarks/results/README.md#high-budget-probe).
    """
    fixed = search.space.fixed
    base = as_given(search)
    specs = [
        (UNCONSTRAINED, base),
        (FULL_AC, base.replace(block_ac_every=1)),
        ("budget-0.5", base.replace(activation_memory_budget=0.5)),
    ]
    space = search.space
    if (
        search.num_trials >= HIGH_BUDGET_MIN_TRIALS
        and "activation_memory_budget" not in fixed
        and space.budget_low <= 0.8 <= space.budget_high
    ):  # a probe of the searched range: not where the user fixed or narrowed the budget
        specs.append((HIGH_BUDGET, base.replace(activation_memory_budget=0.8, **_leanest(search))))
    if search.is_sharded:
        # What sharded training stacks hand-set (torchtitan's selective "op" AC, compiled):
        # the pin reports its slowdown against it, measured the same way in the same study.
        specs.append((OP_SAC, base.replace(block_ac_every=1, block_ac_policy="op")))
    if wants_structured_opening(search):
        specs += settle_probes(search, base.replace(block_ac_every=1))
    return specs


def as_given(search: SearchSpec) -> TrialSpec:
    """Compile at budget 1.0, no block AC, the optimizer and allocator as the user gave them
    (the unconstrained baseline; the other baselines change one thing of it)."""
    fixed = search.space.fixed
    return search.base.replace(
        activation_memory_budget=1.0,
        compile_mode=fixed.get("compile_mode", "default"),
        compile_backend=fixed.get("compile_backend", search.space.compile_backend),
        optimizer_impl=fixed.get("optimizer_impl", "as_written"),
        cuda_alloc_conf=fixed.get("cuda_alloc_conf", ""),
        block_ac_every=0,
    )


def high_budget_retry(search: SearchSpec) -> TrialSpec | None:
    """The high-budget probe again at the user's own values, for when its leanest one crashed.

    A leanest value the workload cannot take (fused for an optimizer with no ``fused`` flag:
    RMSprop, Adamax, NAdam, RAdam, Adadelta) must not cost the study its look at the high
    budgets. None when the probe already ran at the user's values (a retry would crash alike).
    """
    if not _leanest(search):
        return None
    return as_given(search).replace(activation_memory_budget=0.8)


def _leanest(search: SearchSpec) -> dict[str, str]:
    """The least-memory values of the searched knobs that cost no step time, for the
    high-budget probe: the fused optimizer (no foreach temporaries) and expandable segments
    (no fragmentation), each where the space searches it. An infeasible probe then says the
    high-budget range does not fit, not that the allocator fragmented
    (benchmarks/results/README.md#leanest-values).
    """
    space, lean = search.space, {}
    if "optimizer_impl" not in space.fixed and "fused" in space.optimizer_impls:
        lean["optimizer_impl"] = "fused"
    if "cuda_alloc_conf" not in space.fixed and EXPANDABLE in space.cuda_alloc_confs:
        lean["cuda_alloc_conf"] = EXPANDABLE
    return lean


def result_attrs(spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """Everything measured, as trial user attrs any Optuna tool can read."""
    attrs: dict[str, Any] = {
        "outcome": result.outcome.value,
        "error": result.error,
        "failed_stage": result.failed_stage,  # "workload": it failed before any knob mattered
        "spec": spec.to_json_dict(),
        "log_path": result.log_path,
        "wall_s": round(result.wall_s, 3),
        "device_name": result.device_name,
        "torch_version": result.torch_version,
        "world_size": result.world_size,
    }
    if result.model_changes:
        attrs["model_changes"] = list(result.model_changes)
    if result.world_size > 1:
        attrs["failed_rank"] = result.failed_rank
        attrs["ranks"] = [rank_attrs(r) for r in result.ranks]
    m = result.measurement
    if m is not None:
        attrs.update(
            {
                "peak_allocated_bytes": m.peak_allocated_bytes,
                "peak_reserved_bytes": m.peak_reserved_bytes,
                "peak_device_bytes": m.peak_device_bytes,
                "steady_bytes": m.steady_bytes,
                "phase_peak_bytes": dict(m.phase_peak_bytes),
                "peak_phase": m.peak_phase,
                "step_time_ms": m.step_time_ms,
                "step_time_p10_ms": m.step_time_p10_ms,
                "step_time_p90_ms": m.step_time_p90_ms,
                "compile_s": m.compile_s,
                "loss": m.loss,
                "grad_norm": m.grad_norm,
            }
        )
    return attrs


def rank_attrs(rank: RankFigures) -> dict[str, Any]:
    """One rank's figures as a JSON dict (the trial's ``ranks`` user attr)."""
    m = rank.measurement
    figures: dict[str, Any] = {"rank": rank.rank, "outcome": rank.outcome.value}
    if rank.error:
        figures["error"] = rank.error
    if m is not None:
        figures.update(
            peak_allocated_bytes=m.peak_allocated_bytes,
            peak_reserved_bytes=m.peak_reserved_bytes,
            peak_device_bytes=m.peak_device_bytes,
            steady_bytes=m.steady_bytes,
            peak_phase=m.peak_phase,
            step_time_ms=m.step_time_ms,
        )
    return figures


class SearchObserver:
    """Receives a search's progress (the CLI renders it); the default ignores everything."""

    def started(self, study_name: str, total: int) -> None:
        """The storage and study are open; ``total`` trials are about to run."""

    def trial_done(self, event: TrialEvent) -> None:
        """One trial finished (whatever its outcome)."""

    def phase(self, text: str) -> None:
        """A new phase began (e.g. re-verification)."""

    def notice(self, text: str) -> None:
        """Something the user should read as it happens (one line)."""

    def trials_finished(self, done: int, best_ms: float | None) -> None:
        """``done`` trials finished by this invocation's workers (``--gpus``)."""
