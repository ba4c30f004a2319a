"""`SearchSpec`: one whole search — the workload, the limit, the space, the budget of trials."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from budgettune.errors import SpecError, UsageError
from budgettune.pinning.pin_schema import STUDY_NAME
from budgettune.study.batch import (
    MAX_GLOBAL_BATCH,  # noqa: F401 - re-exported
    accumulated,
    given_micro_batch,
    micro_batch_sizes,
)
from budgettune.study.expressible import check_target, narrowed_for
from budgettune.study.space import SearchSpace
from budgettune.trial.knobs import is_int
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec
from budgettune.trial.trial_run import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_TRIAL_TIMEOUT_S,
    DEVICE_PATTERN,
    MAX_WORLD_SIZE,
    TrialRun,
    check_world,
)

MemMetric = Literal["device", "reserved", "allocated"]
MEM_METRIC_CHOICES: tuple[str, ...] = get_args(MemMetric)
Sampler = Literal["tpe", "gp"]
SAMPLER_CHOICES: tuple[str, ...] = get_args(Sampler)
DEFAULT_WORKLOAD = "builtin:tiny-gpt"
"""The workload of a search that names none."""
DEFAULT_RUNS_DIR = "budgettune-runs"
"""Where trial folders go, under the working directory, when no --runs-dir is given."""
MAX_COUNT = 1_000_000
"""Bound of a study's counts (trials, candidates): no real study comes near it."""
MAX_REVERIFY_RUNS = 100
"""Bound of --reverify-runs (each run is a fresh process per candidate)."""
MIN_LIMIT_BYTES = 2**20
"""A limit below this (1 MiB) is a number written without its unit (``max_mem = 120``)."""
MAX_LIMIT_BYTES = 2**63 - 1
"""The largest limit the storage records (a 64-bit integer column of the pin)."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""The longest trial or collective timeout accepted: a week is past any trial, and far
longer values overflow the waits that take them."""
HOST_SHARE = 0.5
"""The default ``--max-host-mem``: this share of the host's physical memory, for the host
memory a trial's offloaded activations hold (all its ranks together)."""
MAX_TRIALS_PER_GPU = 8
"""The most trials `trials_per_gpu` runs on one GPU at once (each holds its model there)."""
MAX_SEED = 2**32 - 1
"""The largest sampler seed (the TPE sampler seeds numpy, which takes 32 bits)."""
STUDY_NAME_PATTERN = re.compile(STUDY_NAME)
"""A study name: it becomes a folder under the runs folder, so no separator, no leading dot."""
STUDY_NAME_RULE = "1 to 200 letters, digits, '.', '_' or '-', starting with a letter, digit or '_'"


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpec:
    """A whole search: the workload, the limit, the space, the budget of trials."""

    workload: str
    """Workload reference (see `TrialRun.workload`)."""
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    """Builder keyword arguments."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    max_mem_bytes: int
    """The memory limit, checked against ``mem_metric``."""
    mem_metric: MemMetric = "device"
    """``device`` (what nvidia-smi shows), ``reserved`` or ``allocated``."""
    num_trials: int = 20
    """Trials this invocation adds to the study (baselines included on a new study)."""
    study_name: str
    """The Optuna study; re-running with the same name resumes it."""
    storage_url: str | None = None
    """SQLAlchemy URL or SQLite path; None is ``./budgettune.db``."""
    space: SearchSpace
    """What may vary."""
    base: TrialSpec = field(default_factory=TrialSpec)
    """Seed and step counts, and the values of dimensions the space does not vary."""
    top_k: int = 3
    """Feasible configurations re-measured at the end."""
    reverify_runs: int = 3
    """Fresh processes per re-measured configuration."""
    margin: float = 0.03
    """The pin's worst re-measured peak times (1 + margin) must stay under the limit."""
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    """Wall-clock limit of one trial process."""
    runs_dir: str = DEFAULT_RUNS_DIR
    """Where trial specs, results, logs and compile caches go."""
    compile_cache: bool = True
    """Reuse compiled code between trials of the same partition variant."""
    sampler: Sampler = "tpe"
    """Optuna's sampler after the opening: ``tpe`` (multivariate, grouped) or ``gp``
    (`GPSampler`), both with the limit as a constraint (`search.study.make_sampler`)."""
    sampler_seed: int | None = None
    """Seed of the sampler (reproducible suggestions)."""
    nproc_per_node: int = 1
    """Ranks per trial: above 1 each trial is a sharded (FSDP2) job under torchrun."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Process-group timeout of each rank of a sharded trial."""
    max_host_mem_bytes: int | None = None
    """Host memory a trial's offloaded activations may hold (all its ranks together); None
    becomes `HOST_SHARE` of this host's memory when the spec is made."""
    trials_per_gpu: int = 1
    """Trials run at once on each GPU (one-rank CUDA trials): above 1 they take turns on it,
    so that only their compiles overlap (`budgettune.trial.gpu_turns`)."""
    global_batch: int = 0
    """Rows per optimizer step (per rank), the same in every trial: each trial runs its
    micro-batch with ``global_batch / micro_batch`` passes accumulated, so every step time is
    that of one optimizer step at this batch (0: each trial's own batch, one pass)."""
    target: str = ""
    """A training stack whose config must hold the pin (``torchtitan``): the search keeps to
    what it expresses (`study.expressible`); empty: every configuration."""

    def __post_init__(self) -> None:
        if not is_int(self.max_mem_bytes) or self.max_mem_bytes <= 0:
            raise UsageError(f"--max-mem must be a positive size, got {self.max_mem_bytes!r}")
        if self.max_mem_bytes < MIN_LIMIT_BYTES:
            raise UsageError(
                f"--max-mem {self.max_mem_bytes} bytes is certainly missing its unit (no "
                f"training step fits in under 1 MiB): write it as {self.max_mem_bytes}GB or "
                f"{self.max_mem_bytes}MB"
            )
        if self.max_mem_bytes > MAX_LIMIT_BYTES:
            raise UsageError(
                f"--max-mem {self.max_mem_bytes} bytes is more than the storage records "
                f"({MAX_LIMIT_BYTES} bytes)"
            )
        if self.mem_metric not in MEM_METRIC_CHOICES:
            raise UsageError(
                f"--mem-metric: unknown metric {self.mem_metric!r}; "
                f"choose one of {', '.join(MEM_METRIC_CHOICES)}"
            )
        if not isinstance(self.workload, str) or not self.workload.strip():
            raise UsageError(f"--workload must name a workload, got {self.workload!r}")
        # bounded: a search of 10^23 trials started and ran (issue 48)
        for flag, count, low, high in (
            ("--num-trials", self.num_trials, 0, MAX_COUNT),
            ("--top-k", self.top_k, 1, MAX_COUNT),
            ("--reverify-runs", self.reverify_runs, 1, MAX_REVERIFY_RUNS),
            ("--nproc-per-node", self.nproc_per_node, 1, MAX_WORLD_SIZE),  # as a pin's
        ):
            if not is_int(count) or not low <= count <= high:
                shown = repr(count) if len(repr(count)) <= 40 else f"{repr(count)[:40]}..."
                raise UsageError(f"{flag} must be an integer from {low} to {high}, got {shown}")
        if not _is_number(self.margin) or not 0.0 <= self.margin < 0.5:
            raise UsageError(f"--margin must be within [0, 0.5), got {self.margin!r}")
        check_seconds("--trial-timeout-s", self.trial_timeout_s)
        check_seconds("--collective-timeout-s", self.collective_timeout_s)
        if self.sampler_seed is not None and (
            not is_int(self.sampler_seed) or not 0 <= self.sampler_seed <= MAX_SEED
        ):
            raise UsageError(
                f"--sampler-seed must be an integer from 0 to {MAX_SEED}, "
                f"got {self.sampler_seed!r}"
            )
        if self.sampler not in SAMPLER_CHOICES:
            raise UsageError(
                f"--sampler: unknown sampler {self.sampler!r}; "
                f"choose one of {', '.join(SAMPLER_CHOICES)}"
            )
        if self.sampler == "gp" and importlib.util.find_spec("scipy") is None:
            raise UsageError("--sampler gp needs scipy: pip install 'budgettune[gp]'")
        if not isinstance(self.compile_cache, bool):
            raise UsageError(f"compile_cache must be true or false, got {self.compile_cache!r}")
        if not isinstance(self.runs_dir, str) or not self.runs_dir.strip():
            raise UsageError(f"--runs-dir must name a folder, got {self.runs_dir!r}")
        if self.storage_url is not None and not isinstance(self.storage_url, str):
            raise UsageError(f"--storage-url must be a URL or a path, got {self.storage_url!r}")
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise UsageError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        check_study_name(self.study_name, what="--study-name")
        try:
            check_world(self.device, self.nproc_per_node)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        if not is_int(self.trials_per_gpu) or not 1 <= self.trials_per_gpu <= MAX_TRIALS_PER_GPU:
            raise UsageError(
                f"--trials-per-gpu must be an integer from 1 to {MAX_TRIALS_PER_GPU}, got "
                f"{self.trials_per_gpu!r}"
            )
        if self.trials_per_gpu > 1 and (not self.device.startswith("cuda") or self.is_sharded):
            raise UsageError(
                "--trials-per-gpu above 1 shares a GPU between one-rank trials: it needs "
                "--device cuda and no --nproc-per-node"
            )
        check_target(self.target)
        object.__setattr__(self, "space", narrowed_for(self.space, self.target))
        self._check_estimators()
        self._check_compiled_offload()
        self._check_batch()
        host = self.max_host_mem_bytes
        if host is None:
            host = default_host_limit()
            object.__setattr__(self, "max_host_mem_bytes", host)
        if not is_int(host) or not MIN_LIMIT_BYTES <= host <= MAX_LIMIT_BYTES:
            raise UsageError(f"--max-host-mem must be a size of at least 1 MiB, got {host!r}")
        object.__setattr__(self, "workload_options", dict(self.workload_options))

    def _check_batch(self) -> None:
        """The micro-batches tried, narrowed to those that divide the global batch."""
        knob = KNOB_BY_NAME["micro_batch"]
        sizes = self.space.values_of(knob)
        kept = micro_batch_sizes(self.global_batch, sizes, self.workload_options)
        if kept != sizes and knob.name not in self.space.fixed:
            object.__setattr__(self, "space", self.space.replace(lists={knob.plural: kept}))

    def batched(self, spec: TrialSpec) -> TrialSpec:
        """``spec`` with the accumulation up to the global batch (`batch.accumulated`)."""
        return accumulated(spec, self.global_batch)

    @property
    def ranking_rows(self) -> int:
        """The rows every trial's step time is scaled to before the search ranks it
        (`TrialSpec.ranked_ms`): the given micro-batch in a search over several micro-batches
        without a global batch, whose trials step on rows of their own (so the search ranks
        samples per second, issue 46); else 0, every trial's step being of the same rows."""
        sizes = self.space.values_of(KNOB_BY_NAME["micro_batch"])
        if self.global_batch or len(sizes) < 2:
            return 0
        return self.given_micro_batch()

    def given_micro_batch(self) -> int:
        """The baselines' micro-batch (`batch.given_micro_batch`)."""
        sizes = self.space.values_of(KNOB_BY_NAME["micro_batch"])
        return given_micro_batch(sizes, self.workload_options)

    def _check_compiled_offload(self) -> None:
        """``op_offload`` needs compile: a space that could pair it with eager is refused."""
        modes = self.space.values_of(KNOB_BY_NAME["compile_mode"])
        policies = self.space.values_of(KNOB_BY_NAME["block_ac_policy"])
        if "eager" in modes and "op_offload" in policies:
            raise UsageError(
                "block_ac_policy op_offload needs torch.compile: drop eager from the compile "
                "modes or op_offload from the block AC policies"
            )

    def _check_estimators(self) -> None:
        """``runtime_estimator="profile"`` needs CUDA: refused before any trial."""
        fixed = self.space.fixed.get("runtime_estimator")
        estimators = (fixed,) if fixed is not None else self.space.runtime_estimators
        if self.device == "cpu" and "profile" in estimators:
            raise UsageError(
                "runtime_estimator 'profile' needs CUDA; on --device cpu search 'flops' only "
                "(drop profile from --runtime-estimators or --fix runtime_estimator=flops)"
            )

    @property
    def host_limit_bytes(self) -> int:
        """``max_host_mem_bytes``, resolved (never None once the spec is made)."""
        assert self.max_host_mem_bytes is not None
        return self.max_host_mem_bytes

    @property
    def compiled_offload_searched(self) -> bool:
        """Whether some trial may use the partitioner's offloading (``op_offload``)."""
        policies = self.space.values_of(KNOB_BY_NAME["block_ac_policy"])
        strides = self.space.values_of(KNOB_BY_NAME["block_ac_every"])
        return "op_offload" in policies and any(strides)

    @property
    def offload_searched(self) -> bool:
        """Whether some trial of the search may offload (the host limit matters)."""
        hooks = any(self.space.values_of(KNOB_BY_NAME["offload_every"]))
        return hooks or self.compiled_offload_searched

    @property
    def is_sharded(self) -> bool:
        """Whether each trial runs on several ranks."""
        return self.nproc_per_node > 1

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form stored with a study, so workers can join it.

        The storage URL is left out (it may hold a password, and every worker names its own).
        """
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            data[f.name] = getattr(self, f.name)
        data["workload_options"] = dict(self.workload_options)
        data["space"] = self.space.to_json_dict()
        data["base"] = self.base.to_json_dict()
        del data["storage_url"]
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any], **overrides: Any) -> SearchSpec:
        """Build from the JSON form, with some fields replaced (a worker's device, storage...).

        Raises:
            SpecError: on an unknown key or an invalid value.
            UsageError: on an invalid search-level value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown SearchSpec key(s): {', '.join(unknown)}")
        values = dict(data)
        values["space"] = SearchSpace.from_json_dict(values["space"])
        values["base"] = TrialSpec.from_json_dict(values.get("base", {}))
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> SearchSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def trial_run(self, spec: TrialSpec) -> TrialRun:
        """The `TrialRun` that measures ``spec`` for this search."""
        cache_root = f"{self.runs_dir}/compile-cache" if self.compile_cache else None
        return TrialRun(
            spec=spec,
            workload=self.workload,
            workload_options=self.workload_options,
            device=self.device,
            cache_root=cache_root,
            nproc_per_node=self.nproc_per_node,
            collective_timeout_s=self.collective_timeout_s,
            shared_gpu=self.shares_gpus,
        )

    @property
    def shares_gpus(self) -> bool:
        """Whether several of its trials run on one GPU at once (they take turns on it)."""
        return self.trials_per_gpu > 1


SEARCH_DEFAULTS: Mapping[str, Any] = {
    f.name: f.default
    for f in dataclasses.fields(SearchSpec)
    if f.default is not dataclasses.MISSING
}
"""Each `SearchSpec` field's default, as declared above (the CLI and study files read them)."""


def host_memory_bytes() -> int:
    """This host's physical memory (0 where the system does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def default_host_limit() -> int:
    """`HOST_SHARE` of this host's memory (1 TiB where the system does not say)."""
    total = host_memory_bytes()
    return int(total * HOST_SHARE) if total > 0 else 2**40


def check_study_name(name: object, *, what: str = "--study") -> None:
    """Refuse a study name that could not be a plain folder name (it names the study's folder
    under the runs folder and appears in the dashboard).

    Raises:
        UsageError: naming the allowed characters.
    """
    if not isinstance(name, str) or not STUDY_NAME_PATTERN.fullmatch(name):
        raise UsageError(f"{what} {name!r} is not a study name: use {STUDY_NAME_RULE}")


def check_seconds(flag: str, seconds: object) -> None:
    """A timeout is a number of seconds above 0 and at most a week (`MAX_TIMEOUT_S`): 0 would
    end every run before it starts, a larger one overflows the waits that take it.

    Raises:
        UsageError: one line naming the flag (NaN and infinity included).
    """
    in_range = (
        isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and 0.0 < seconds <= MAX_TIMEOUT_S  # NaN and infinity fail here
    )
    if not in_range:
        raise UsageError(
            f"{flag} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:g} (a week), "
            f"got {seconds!r}"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
