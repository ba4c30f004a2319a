"""The study file's schema: every key, with its type, its range or choices, and finiteness.

One pydantic model per table (top level, ``[space]``, ``[fix]``, ``[trial]``), strict (no
``"3"`` for 3, no ``true`` for 1, no ``"no"`` for false) and finite (no ``inf``, ``nan``).
`check_study_values` validates a parsed file once and raises one line naming the key and what
it allows, e.g. ``study.toml: trials must be an integer >= 0, got 'three'``; what a key allows is
read off the key's own JSON schema (`budgettune.schema`), so the declaration below is the only
place it is written.
What relates two keys (``low <= high``, a flag overriding a key) is checked by `SearchSpec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonDict

from budgettune.errors import SpecError, StudyFileError
from budgettune.schema import OneOf, first_problem
from budgettune.search.spec import (
    MAX_SEED,
    MAX_TIMEOUT_S,
    MEM_METRIC_CHOICES,
    STUDY_NAME_PATTERN,
    STUDY_NAME_RULE,
)
from budgettune.trial.allocator import parse_settings
from budgettune.trial.spec import (
    BLOCK_AC_POLICIES,
    COMPILE_BACKENDS,
    COMPILE_MODES,
    DEVICE_PATTERN,
    KNAPSACK_SOLVERS,
    OP_NAME_PATTERN,
    OPTIMIZER_IMPLS,
    RUNTIME_ESTIMATORS,
)


def _alloc_conf(value: str) -> str:
    try:
        parse_settings(value)
    except SpecError as exc:  # pydantic reports a ValueError as this key's error
        raise ValueError(str(exc)) from None
    return value


_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)
_ALLOC_CONF_TEXT = "PYTORCH_CUDA_ALLOC_CONF settings like expandable_segments:True ('' = unset)"
_OPS_TEXT = "a list of op names like aten.add or prims.convert_element_type"

Text = Annotated[str, Field(min_length=1)]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
Budget = Annotated[float, Field(ge=0, le=1)]
OpName = Annotated[str, Field(pattern=OP_NAME_PATTERN.pattern)]
AllocConf = Annotated[str, AfterValidator(_alloc_conf)]
Scalar = str | bool | int | float
OptionName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Metric = Annotated[str, OneOf(MEM_METRIC_CHOICES)]
Solver = Annotated[str, OneOf(KNAPSACK_SOLVERS)]
Estimator = Annotated[str, OneOf(RUNTIME_ESTIMATORS)]
Mode = Annotated[str, OneOf(COMPILE_MODES)]
Backend = Annotated[str, OneOf(COMPILE_BACKENDS)]
Policy = Annotated[str, OneOf(BLOCK_AC_POLICIES)]
OptimizerImpl = Annotated[str, OneOf(OPTIMIZER_IMPLS)]
NON_EMPTY = Field(min_length=1)


def _key(text: str, allowed: str | None = None) -> Any:
    """A key's help text, and what it allows where its type alone does not say it well."""
    extra: JsonDict | None = {"allowed": allowed} if allowed else None
    return Field(None, description=text, json_schema_extra=extra)


class StudyTable(BaseModel):
    """The top level of a study file."""

    model_config = _STRICT

    workload: Text | None = _key("workload reference")
    workload_options: dict[OptionName, Scalar | list[Scalar]] | None = _key(
        "table of builder options",
        "a table of builder options: strings, numbers, booleans or lists of them",
    )
    device: Annotated[str, Field(pattern=DEVICE_PATTERN.pattern)] | None = _key(
        "cpu, cuda or cuda:N", "cpu, cuda or cuda:N"
    )
    max_mem: str | int | float | None = _key(
        "memory limit, e.g. 20GB", 'a size like "20GB" or "18.5GiB"'
    )
    mem_metric: Metric | None = _key("device, reserved or allocated")
    trials: Count | None = _key("trials per invocation")
    study: Annotated[str, Field(pattern=STUDY_NAME_PATTERN.pattern)] | None = _key(
        "study name", f"a study name of {STUDY_NAME_RULE}"
    )
    storage: Text | None = _key("SQLAlchemy URL or SQLite path")
    top_k: Positive | None = _key("configurations re-verified")
    reverify: Positive | None = _key("re-measurements per configuration")
    margin: Annotated[float, Field(ge=0, lt=0.5)] | None = _key(
        "fits when peak x (1 + margin) is within max_mem (search, re-verification, pin)"
    )
    timeout: Seconds | None = _key("seconds per trial")
    runs_dir: Text | None = _key("folder for trial logs and caches")
    compile_cache: bool | None = _key("reuse compiled code per partition variant")
    sampler_seed: Seed | None = _key("seed of the sampler")
    nproc_per_node: Positive | None = _key(
        "ranks per trial (above 1: sharded with FSDP2 under torchrun)"
    )
    collective_timeout: Seconds | None = _key(
        "seconds a rank's collective may wait before it fails"
    )
    space: dict[str, Any] | None = _key("table: the search space", "a table")
    fix: dict[str, Any] | None = _key("table: dimensions held at one value", "a table")
    trial: dict[str, Any] | None = _key("table: warmup_steps, timed_steps, seed", "a table")


class SpaceTable(BaseModel):
    """``[space]``: what the search may vary (each key narrows one `SearchSpace` field)."""

    model_config = _STRICT

    budget: Annotated[list[Budget], Field(min_length=2, max_length=2)] | None = _key(
        "budget_range", "[low, high] with 0 <= low <= high <= 1, e.g. [0.0, 1.0]"
    )
    remove_ops: list[OpName] | None = _key("removable_ops", _OPS_TEXT)
    add_ops: list[OpName] | None = _key("addable_ops", _OPS_TEXT)
    solvers: Annotated[list[Solver], NON_EMPTY] | None = _key("knapsack_solvers")
    estimators: Annotated[list[Estimator], NON_EMPTY] | None = _key("runtime_estimators")
    modes: Annotated[list[Mode], NON_EMPTY] | None = _key("compile_modes")
    backend: Backend | None = _key("compile_backend")
    ac_every: Annotated[list[Count], NON_EMPTY] | None = _key("block_ac_every")
    ac_policies: Annotated[list[Policy], NON_EMPTY] | None = _key("block_ac_policies")
    optimizer_impls: Annotated[list[OptimizerImpl], NON_EMPTY] | None = _key("optimizer_impls")
    alloc_confs: Annotated[list[AllocConf], NON_EMPTY] | None = _key(
        "cuda_alloc_confs", f"a non-empty list of {_ALLOC_CONF_TEXT}"
    )


class FixTable(BaseModel):
    """``[fix]``: dimensions held at one value (the `TrialSpec` field names)."""

    model_config = _STRICT

    activation_memory_budget: Budget | None = None
    knapsack_solver: Solver | None = None
    runtime_estimator: Estimator | None = None
    compile_mode: Mode | None = None
    compile_backend: Backend | None = None
    block_ac_every: Count | None = None
    block_ac_policy: Policy | None = None
    optimizer_impl: OptimizerImpl | None = None
    cuda_alloc_conf: AllocConf | None = _key("allocator setting", _ALLOC_CONF_TEXT)


class TrialTable(BaseModel):
    """``[trial]``: the step counts and seed of every trial."""

    model_config = _STRICT

    warmup_steps: Positive | None = _key("untimed steps before measuring")
    timed_steps: Positive | None = _key("timed steps per trial")
    seed: Seed | None = _key("seed of the step's randomness")


TABLES: dict[str, type[BaseModel]] = {
    "": StudyTable,
    "space": SpaceTable,
    "fix": FixTable,
    "trial": TrialTable,
}
"""Each table of a study file (``""``: the top level) and its model."""


def check_study_values(source: str, data: Mapping[str, Any]) -> None:
    """Validate a parsed study file: known keys, each of its type and within its range.

    Raises:
        StudyFileError: one line naming the first bad key, what it allows, and its value.
    """
    for table, model in TABLES.items():
        values = data if not table else data.get(table)
        if values is None:
            continue
        prefix = f"{table}." if table else ""
        unknown = sorted(set(values) - set(model.model_fields))
        if unknown:
            raise StudyFileError(
                f"{source}: unknown key '{prefix}{unknown[0]}'; known keys: "
                + ", ".join(f"{prefix}{k}" for k in model.model_fields)
            )
        problem = first_problem(model, values)
        if problem is not None:
            raise StudyFileError(
                f"{source}: {prefix}{problem.key} must be {problem.allowed}, "
                f"got {values[problem.key]!r}"
            )
