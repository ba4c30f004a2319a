"""What a study is made of: its name and attrs, its sampler and constraint, its baselines,
and the events a search reports to its observer (the user attrs' keys and a trial's record
are `storage.user_attrs`).
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from budgettune.storage.trials import FULL_AC, OP_SAC, UNCONSTRAINED
from budgettune.storage.user_attrs import violation_of
from budgettune.study.spec import MAX_SEED, STUDY_NAME_PATTERN, SearchSpec
from budgettune.study.structured import settle_probes, wants_structured_opening
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import EXPANDABLE, TrialSpec

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
        # a study of one batch per trial keeps the attrs it had before issue 46
        **({"global_batch": search.global_batch} if search.global_batch else {}),
        # a study over micro-batches without one ranks per row (`SearchSpec.ranking_rows`)
        **({"ranking_rows": search.ranking_rows} if search.ranking_rows else {}),
        # not the host limit: its default is a share of each host's memory, and the pin
        # checks its re-measurements against the limit of the search that pins
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
    if STUDY_NAME_PATTERN.fullmatch(safe):
        return safe
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{safe[:180]}-{digest}"


SAMPLER_STREAM_ENV = "BUDGETTUNE_SAMPLER_STREAM"
"""Set by `budgettune.study.workers.run_gpu_workers` for each worker it starts (1, 2, ...):
the worker's own stream of the study's sampler seed (`worker_sampler_seed`)."""


def worker_sampler_seed(seed: int | None, stream: int) -> int | None:
    """A worker's sampler seed: the study's seed moved by the worker's ``stream``.

    Every worker samples with its own sampler; with the study's seed as it is, each one's
    random draws were the same, so a 4-GPU search of 16 workers ran one configuration 12
    times (issue 44). A seeded study still searches reproducibly where one process runs its
    trials; where workers race, the order they finish in decides anyway.
    """
    return None if seed is None else (seed + stream) % (MAX_SEED + 1)


def sampler_stream() -> int:
    """This worker's stream: `SAMPLER_STREAM_ENV` (from `run_gpu_workers`), else (a worker
    started by hand) its process id, so that two such workers draw apart too."""
    try:
        return int(os.environ[SAMPLER_STREAM_ENV])
    except (KeyError, ValueError):
        return os.getpid()


def make_sampler(search: SearchSpec) -> optuna.samplers.BaseSampler:
    """The search's sampler with Optuna's constraint support: TPE (multivariate, grouped,
    with the constant liar for parallel workers) or a Gaussian process (`GPSampler`; a
    parameter present in some trials only, as a block-AC policy, is drawn at random)."""
    with warnings.catch_warnings():
        # `group` is experimental, `warn_independent_sampling` and `constraints_func` are
        # deprecated in Optuna 5.0 but still the documented way; say so once, not every run.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if search.sampler == "gp":
            return optuna.samplers.GPSampler(
                seed=search.sampler_seed,
                n_startup_trials=max(3, min(8, search.num_trials // 3)),
                constraints_func=constraints_of,
                warn_independent_sampling=False,
            )
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
    return [violation_of(trial.user_attrs)]


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


_SET_BY_BASELINES = ("activation_memory_budget", "block_ac_every", "block_ac_policy")
"""The knobs the baselines set themselves (a value fixed for the search does not apply)."""


def as_given(search: SearchSpec) -> TrialSpec:
    """Compile at budget 1.0, no block AC, the optimizer and allocator as the user gave them,
    every other knob the search fixes (offload, ...) at its fixed value (the unconstrained
    baseline; the other baselines change one thing of it). A search that lists one compile
    scope says how the job compiles (``--compile-scopes blocks``: block by block, as
    torchtitan does), so the baselines compile so too."""
    held = {k: v for k, v in search.space.fixed.items() if k not in _SET_BY_BASELINES}
    scopes = search.space.lists["compile_scopes"]
    if len(scopes) == 1 and "compile_scope" not in held:
        held["compile_scope"] = scopes[0]
    defaults: dict[str, Any] = {
        "compile_mode": "default",
        "compile_backend": search.space.compile_backend,
        "optimizer_impl": "as_written",
        "cuda_alloc_conf": "",
    }
    if search.global_batch or search.ranking_rows:  # the baselines' rows are said, not the
        defaults["micro_batch"] = search.given_micro_batch()  # workload's own
    # the fixed values win over those defaults
    return search.batched(
        search.base.replace(
            **{**defaults, **held, "activation_memory_budget": 1.0, "block_ac_every": 0}
        )
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
