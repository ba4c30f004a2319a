"""The study file's schema: every key, with its type, its range or choices, and finiteness.

One pydantic model per table (top level, ``[space]``, ``[fix]``, ``[trial]``; the last three
made from the knobs' definitions, `budgettune.trial.knobs`), strict (no
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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import JsonDict

from budgettune.errors import SpecError, StudyFileError, UsageError, shown_value
from budgettune.schema import OneOf, first_problem
from budgettune.study.batch import powers_of_two
from budgettune.study.expressible import TARGETS
from budgettune.study.space import FIXABLE
from budgettune.study.spec import (
    MAX_COUNT,
    MAX_GLOBAL_BATCH,
    MAX_REVERIFY_RUNS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_TRIALS_PER_GPU,
    MEM_METRIC_CHOICES,
    SAMPLER_CHOICES,
    SEARCH_DEFAULTS,
    STUDY_NAME_PATTERN,
    STUDY_NAME_RULE,
)
from budgettune.trial.allocator import parse_settings
from budgettune.trial.knobs import Knob
from budgettune.trial.spec import KNOB_BY_NAME, KNOBS, MAX_STEPS, OP_NAME_PATTERN
from budgettune.trial.trial_run import DEVICE_PATTERN, MAX_WORLD_SIZE


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
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
Budget = Annotated[float, Field(ge=0, le=1)]
OpName = Annotated[str, Field(pattern=OP_NAME_PATTERN.pattern)]
AllocConf = Annotated[str, AfterValidator(_alloc_conf)]
Scalar = str | bool | int | float
OptionName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Metric = Annotated[str, OneOf(MEM_METRIC_CHOICES)]
NON_EMPTY = Field(min_length=1)


def _key(text: str, allowed: str | None = None) -> Any:
    """A key's help text, and what it allows where its type alone does not say it well."""
    extra: JsonDict | None = {"allowed": allowed} if allowed else None
    return Field(None, description=text, json_schema_extra=extra)


class StudyTable(BaseModel):
    """The top level of a study file: `SearchSpec`'s field names (``max_mem`` and
    ``max_host_mem`` are sizes with their unit that become ``max_mem_bytes`` and
    ``max_host_mem_bytes``)."""

    model_config = _STRICT

    workload: Text | None = _key(
        "the workload: builtin:NAME, hf:DIR_OR_TYPE, path/to/file.py:fn or pkg.module:fn"
    )
    workload_options: dict[OptionName, Scalar | list[Scalar]] | None = _key(
        "table of builder options",
        "a table of builder options: strings, numbers, booleans or lists of them",
    )
    device: Annotated[str, Field(pattern=DEVICE_PATTERN.pattern)] | None = _key(
        "the device: cpu, cuda or cuda:N (default: the workload's, cuda where there is a GPU)",
        "cpu, cuda or cuda:N",
    )
    max_mem: str | int | float | None = _key(
        "memory limit, e.g. 20GB or 18.5GiB (required)", 'a size like "20GB" or "18.5GiB"'
    )
    max_host_mem: str | int | float | None = _key(
        "host memory a trial's offloaded activations may hold, all its ranks together "
        "(offload_every); a trial over it does not fit. Default: half of this host's memory",
        'a size like "64GB"',
    )
    mem_metric: Metric | None = _key(
        "what max_mem limits: device (nvidia-smi), reserved or allocated"
    )
    num_trials: Count | None = _key(
        f"trials to add to the study (default {SEARCH_DEFAULTS['num_trials']}; a new study's "
        "first ones are budget 1.0, full block AC, budget 0.5, and budget 0.8 from 10 trials on "
        "where the budget range holds it, with fused AdamW and expandable segments where those "
        "are searched; from 8 trials on, full block AC with each of those flipped, the winner "
        "on both memory and time held for the study, then block AC strides per policy placed "
        "by bisection on the memory axis, then each choice left unsettled flipped at the "
        "fastest point that fits; from 16 trials on, beside those, the budget of the "
        "block-AC point over the limit nearest to it, and of its next sparser stride, lowered "
        "by bisection until it fits); 0 runs none and only re-verifies and pins what an existing "
        "study holds (a search cut off before its pin)"
    )
    study_name: Annotated[str, Field(pattern=STUDY_NAME_PATTERN.pattern)] | None = _key(
        "study name (default: from workload, device, limit)",
        f"a study name of {STUDY_NAME_RULE}",
    )
    storage_url: Text | None = _key("SQLAlchemy URL or SQLite path (default ./budgettune.db)")
    top_k: Positive | None = _key(
        "fastest fitting configurations re-verified together (default "
        f"{SEARCH_DEFAULTS['top_k']}); if none holds, the next ones are re-verified one by "
        "one, up to 8 in all, before exit 3"
    )
    reverify_runs: Annotated[int, Field(ge=1, le=MAX_REVERIFY_RUNS)] | None = _key(
        "rounds of fresh re-measurement at most: round 1 measures each of the top_k once, a "
        "later round only those within twice the noise of the fastest (the noise read from "
        "the runs), until one stands alone; the winner also gets one run with empty compile "
        "caches, as a job on a fresh host starts"
    )
    margin: Annotated[float, Field(ge=0, lt=0.5)] | None = _key(
        "safety margin: a configuration fits when its peak x (1 + margin) is within max_mem, "
        "for the search, the re-verification and the pin alike. It absorbs run-to-run "
        "variation of the peak; 0.01-0.05 is sensible"
    )
    trial_timeout_s: Seconds | None = _key("seconds before a trial is killed")
    runs_dir: Text | None = _key("folder for trial logs and compile caches")
    compile_cache: bool | None = _key(
        "reuse compiled code per partition variant (false, --no-cache: compile every trial "
        "from scratch)"
    )
    sampler: Annotated[str, OneOf(SAMPLER_CHOICES)] | None = _key(
        "the sampler after the opening: tpe (multivariate TPE) or gp (Gaussian process), both "
        "with the limit as a constraint"
    )
    sampler_seed: Seed | None = _key("sampler seed, for a reproducible search (default: random)")
    nproc_per_node: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)] | None = _key(
        "ranks per trial: above 1 each trial is a sharded job (FSDP2, torchtitan order) under "
        "torchrun; with --gpus, each group of N GPUs runs one trial"
    )
    collective_timeout_s: Seconds | None = _key(
        "seconds a rank's collective may wait before it fails"
    )
    global_batch: Annotated[int, Field(ge=0, le=MAX_GLOBAL_BATCH)] | None = _key(
        "rows per optimizer step (per rank), the same in every trial: each trial accumulates "
        "global_batch / micro_batch passes, and the search ranks time per optimizer step; "
        "with --micro-batches 2,4,8 it searches the micro-batch too (a size that does not "
        "divide it is not tried); without it, several micro-batches each step on their own "
        "rows and the search ranks samples per second"
    )
    target: Annotated[str, OneOf(("", *TARGETS))] | None = _key(
        "a training stack whose config must hold the pin: torchtitan keeps the search to what "
        "its activation_checkpoint, compile and optimizer sections express (block AC or a "
        "memory budget, not both; the op policy on every block; each block compiled on its "
        "own; no op-list edits), so `export --format torchtitan` writes the pin as measured"
    )
    trials_per_gpu: Annotated[int, Field(ge=1, le=MAX_TRIALS_PER_GPU)] | None = _key(
        "trials run at once on each GPU (default 1): they take turns on it, so that only "
        "their compiles overlap (the GPU runs one trial's work at a time, and the others pause "
        "while one measures); a search is then about that many times faster where compiling "
        "is most of a trial. Each holds its model in GPU memory: keep the limit x this well "
        "under the GPU's memory"
    )
    space: dict[str, Any] | None = _key("table: the search space", "a table")
    fix: dict[str, Any] | None = _key("table: dimensions held at one value", "a table")
    trial: dict[str, Any] | None = _key("table: warmup_steps, timed_steps, seed", "a table")


def _value_type(k: Knob) -> Any:
    """The schema of one value of a knob, from its definition."""
    if k.name == "cuda_alloc_conf":
        return AllocConf
    if k.choices and k.value_type is str:
        return Annotated[str, OneOf(k.choices)]
    if k.value_type is bool:
        return bool
    if k.value_type is float:
        return Budget
    if k.value_type is tuple:
        return list[OpName]
    return {"seed": Seed, "warmup_steps": Steps, "timed_steps": Steps}.get(k.name, Count)


def _knob_key(k: Knob, kind: Any, *, allowed: str | None = None) -> tuple[Any, Any]:
    return (kind | None, _key(k.help, allowed))


def _micro_batches(value: list[int] | str) -> list[int]:
    """A range of powers of two (``"1..32"``) as its sizes; a list as it is."""
    if not isinstance(value, str):
        return value
    try:
        return powers_of_two(value)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


def _space_keys() -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for k in KNOBS:
        if not k.is_knob:
            continue
        if k.sampled == "range":
            pair = Annotated[list[Budget], Field(min_length=2, max_length=2)]
            keys[k.plural] = _knob_key(
                k, pair, allowed="[low, high] with 0 <= low <= high <= 1, e.g. [0.0, 1.0]"
            )
        elif k.sampled == "subset":
            keys[k.plural] = _knob_key(k, list[OpName], allowed=_OPS_TEXT)
        elif k.name == "micro_batch":  # a list, or a range of powers of two: "1..32"
            keys[k.plural] = _knob_key(
                k,
                Annotated[Annotated[list[int], NON_EMPTY] | str, AfterValidator(_micro_batches)],
                allowed='a non-empty list of sizes, or a range of powers of two ("1..32")',
            )
        elif k.sampled == "choice":
            text = (
                f"a non-empty list of {_ALLOC_CONF_TEXT}" if k.name == "cuda_alloc_conf" else None
            )
            item = _value_type(k)
            keys[k.plural] = _knob_key(
                k,
                Annotated[list[item], NON_EMPTY],  # type: ignore[valid-type]
                allowed=text,
            )
        elif k.study_wide:
            keys[k.plural] = _knob_key(k, _value_type(k))
    return keys


def _fix_keys() -> dict[str, Any]:
    return {
        name: _knob_key(
            KNOB_BY_NAME[name],
            _value_type(KNOB_BY_NAME[name]),
            allowed=_ALLOC_CONF_TEXT if name == "cuda_alloc_conf" else None,
        )
        for name in FIXABLE
    }


SpaceTable = create_model(  # type: ignore[call-overload]
    "SpaceTable",
    __config__=_STRICT,
    __doc__="``[space]``: what the search may vary: each "
    "knob's list of values under its plural (`Knob.plural`).",
    **_space_keys(),
)
FixTable = create_model(  # type: ignore[call-overload]
    "FixTable",
    __config__=_STRICT,
    __doc__="``[fix]``: knobs held at one value (their `TrialSpec` names).",
    **_fix_keys(),
)
TrialTable = create_model(  # type: ignore[call-overload]
    "TrialTable",
    __config__=_STRICT,
    __doc__="``[trial]``: the step counts and seed of every trial.",
    **{k.name: _knob_key(k, _value_type(k)) for k in KNOBS if not k.is_knob},
)

TABLES: dict[str, type[BaseModel]] = {
    "": StudyTable,
    "space": SpaceTable,
    "fix": FixTable,
    "trial": TrialTable,
}
"""Each table of a study file (``""``: the top level) and its model."""
OLD_KEYS: dict[str, dict[str, str]] = {
    "": {
        "trials": "num_trials",
        "study": "study_name",
        "storage": "storage_url",
        "reverify": "reverify_runs",
        "timeout": "trial_timeout_s",
        "collective_timeout": "collective_timeout_s",
    },
    "space": {k.old_plural: k.plural for k in KNOBS if k.old_plural},
    "fix": {},
    "trial": {},
}
"""Keys of study files written before issue 31, still read (old name -> today's)."""


def new_spelling(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Study values with every old key (`OLD_KEYS`) renamed, table by table, and what each
    renamed key was written as (``"space.compile_modes" -> "space.modes"``).

    Raises:
        StudyFileError: a key written both ways.
    """
    renamed: dict[str, Any] = {}
    written: dict[str, str] = {}
    for table, old in OLD_KEYS.items():
        source = values if not table else values.get(table)
        if not isinstance(source, Mapping):
            continue
        prefix = f"{table}." if table else ""
        target: dict[str, Any] = {}
        for key, value in source.items():
            new = old.get(key, key)
            if new != key:
                if new in source:
                    raise StudyFileError(
                        f"{prefix}{key} and {prefix}{new} are the same key; keep {prefix}{new}"
                    )
                written[prefix + new] = prefix + key
            target[new] = value
        if table:
            renamed[table] = target
        else:
            renamed.update(target)  # tables are replaced by their renamed copies below
    return renamed, written


def check_study_values(source: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a parsed study file: known keys, each of its type and within its range.

    Returns:
        The values with today's key names (old ones, `OLD_KEYS`, renamed).

    Raises:
        StudyFileError: one line naming the first bad key (as written), what it allows, and
            its value.
    """
    try:
        values, written = new_spelling(data)
    except StudyFileError as exc:
        raise StudyFileError(f"{source}: {exc}") from None
    for table, model in TABLES.items():
        table_values = values if not table else values.get(table)
        if table_values is None:
            continue
        prefix = f"{table}." if table else ""
        if not isinstance(table_values, Mapping):
            continue  # the top level's model says what the table must be
        unknown = sorted(set(table_values) - set(model.model_fields))
        if unknown:
            raise StudyFileError(
                f"{source}: unknown key '{prefix}{unknown[0]}'; known keys: "
                + ", ".join(f"{prefix}{k}" for k in model.model_fields)
            )
        problem = first_problem(model, table_values)
        if problem is not None:
            name = written.get(prefix + problem.key, prefix + problem.key)
            raise StudyFileError(
                f"{source}: {name} must be {problem.allowed}, "
                f"got {shown_value(table_values[problem.key])}"
            )
    return values
