"""What a pinned document must hold before any field of it is used: `PinFields` (types and
ranges of the fields read besides the spec) and `check_figures` (every figure of the typed
pin finite and in range), so a hostile or corrupt pin is one line, never a traceback or
minutes of work (issue 48: ``"limit_bytes": 10**400`` measured for minutes, then crashed;
``1e400`` in a peak overflowed; a ``world_size`` of 10**6 would launch that many ranks)."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import JsonDict

from budgettune.errors import shown_value
from budgettune.pinning.document import PinDocument
from budgettune.schema import OneOf
from budgettune.trial.results import MEM_METRICS, TrialOutcome
from budgettune.trial.trial_run import DEVICE_PATTERN, MAX_WORLD_SIZE

MAX_BYTES = 2**63 - 1
"""The largest byte figure a pin may hold (what torch's allocator counters can reach)."""
MAX_COUNT = 2**31 - 1
"""The largest trial number, trial count or run count a pin may hold."""
STUDY_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$"
"""A study name as `budgettune.study.spec.STUDY_NAME_PATTERN` has it (printed in tables: no
newline or terminal escape may come with it)."""
MAX_MS = 1e9
"""The longest step time a pin may hold (11.6 days)."""

BASELINE_STATUSES = ("over_limit", "missing", *(outcome.value for outcome in TrialOutcome))
"""What a pin says of its unconstrained baseline: ``ok`` (an outcome), over the limit, missing,
or the outcome that kept it from running."""
_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
"""A text with no control character (no newline, no terminal escape)."""
_OBJECT: JsonDict = {"allowed": "a JSON object"}
_REFERENCE: JsonDict = {"allowed": "a JSON object or null"}


_TEXT = Annotated[str, Field(max_length=400, pattern=_PRINTABLE)]
"""A short printable text a pin records (a version, a device name, a digest)."""


class _WorkloadFingerprintFields(BaseModel):
    """The workload part of a pin's fingerprint (`workload_fingerprint`)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    param_count: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = None
    param_bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = None
    digest: _TEXT | None = None
    batch: list[_TEXT] | None = None  # each batch tensor's dtype and shape: "int64[4, 100]"


class _FingerprintFields(BaseModel):
    """A pin's ``fingerprint``: what it was measured on (`PinFingerprint`)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    torch_version: _TEXT | None = None
    cuda_version: _TEXT | None = None
    device_name: _TEXT | None = None
    workload: _WorkloadFingerprintFields | None = None


_BYTES = Annotated[int, Field(ge=0, le=MAX_BYTES)]


class _RankFields(BaseModel):
    """One rank's figures in a sharded pin's ``measured.per_rank`` (`RankPeak`)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    rank: Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]
    peak_worst_bytes: _BYTES | None = None
    peak_allocated_bytes: _BYTES | None = None
    steady_bytes: _BYTES | None = None
    step_time_ms: Annotated[float, Field(ge=0, le=MAX_MS)] | None = None


class _MeasuredFields(BaseModel):
    """The parts of a pin's ``measured`` whose shape `PinMeasured` reads without a check of its
    own (the figures are `check_figures`'); the rest as it is."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    step_time_range_ms: (
        Annotated[
            list[Annotated[float, Field(ge=0, le=MAX_MS)]], Field(min_length=2, max_length=2)
        ]
        | None
    ) = None
    per_rank: list[_RankFields] | None = None

    @field_validator("step_time_range_ms")
    @classmethod
    def _low_then_high(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and value[0] > value[1]:
            raise ValueError("the fastest time first")
        return value


class PinFields(BaseModel):
    """The fields of a pinned document (schema v1) read besides its spec, by type and range.

    Every pin budgettune writes has them; the first three are required, as readers need them
    (`budgettune verify` imports the workload and checks the limit on the metric).
    """

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    workload: Annotated[str, Field(min_length=1, max_length=4096)]
    limit_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES)]
    mem_metric: Annotated[str, OneOf(MEM_METRICS)]
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)] = 1
    device: Annotated[str, Field(pattern=DEVICE_PATTERN.pattern)] = Field(
        "cpu", json_schema_extra={"allowed": "cpu, cuda or cuda:N"}
    )
    margin: Annotated[float, Field(ge=0, lt=1)] = 0.0
    trial_number: Annotated[int, Field(ge=0, le=MAX_COUNT)] | None = None
    trials: Annotated[int, Field(ge=0, le=MAX_COUNT)] | None = None
    workload_options: dict[str, Any] | None = Field(None, json_schema_extra=_OBJECT)
    model_changes: list[str] | None = None
    dropout: list[str] | None = None
    schema_version: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    spec: Annotated[dict[str, Any], Field(min_length=1)] | None = Field(
        None, json_schema_extra={"allowed": "a JSON object naming the configuration"}
    )
    measured: _MeasuredFields | None = Field(
        None,
        json_schema_extra={
            "allowed": "a JSON object of figures: step_time_range_ms two step times, per_rank "
            "a list of objects each with its rank"
        },
    )
    fingerprint: _FingerprintFields | None = Field(
        None,
        json_schema_extra={
            "allowed": "a JSON object of short printable texts (torch_version, cuda_version, "
            "device_name, workload.digest) and counts (workload.param_count, param_bytes)"
        },
    )
    baseline: dict[str, Any] | None = Field(None, json_schema_extra=_REFERENCE)
    full_ac: dict[str, Any] | None = Field(None, json_schema_extra=_REFERENCE)
    op_sac: dict[str, Any] | None = Field(None, json_schema_extra=_REFERENCE)
    no_offload: dict[str, Any] | None = Field(None, json_schema_extra=_REFERENCE)
    host_limit_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES)] | None = None
    # texts budgettune wrote, shown by `show` and the exports: one printable paragraph each
    advice: Annotated[str, Field(max_length=4000, pattern=_PRINTABLE)] | None = Field(
        None, json_schema_extra={"allowed": "one line of text, at most 4000 characters"}
    )
    baseline_status: Annotated[str, OneOf(BASELINE_STATUSES)] | None = None
    created_at: Annotated[str, Field(max_length=64, pattern=_PRINTABLE)] | None = Field(
        None, json_schema_extra={"allowed": "a date and time"}
    )
    # how a sharded pin was applied: a sentence (its wording changed over releases), printable
    sharding: Annotated[str, Field(max_length=1000, pattern=_PRINTABLE)] | None = Field(
        None, json_schema_extra={"allowed": "one line of text, at most 1000 characters"}
    )
    study_name: Annotated[str, Field(pattern=STUDY_NAME)] | None = Field(
        None, json_schema_extra={"allowed": "a study name (letters, digits, '.', '_', '-')"}
    )


def _problem(where: str, name: str, value: Any) -> str | None:
    """What is wrong with one figure (None: nothing): a byte or count out of range, a time
    or fraction not finite."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        bound = MAX_COUNT if name in ("runs", "cold_runs", "rank") else MAX_BYTES
        counted = name.endswith("bytes") or bound == MAX_COUNT  # never below 0
        if not (0 if counted else -MAX_BYTES) <= value <= bound:
            return f"{where}{name} is {shown_value(value)}: out of range"
    elif isinstance(value, float):
        limit = MAX_MS if name.endswith("_ms") else 1e30
        if not math.isfinite(value) or abs(value) > limit:
            return f"{where}{name} is {shown_value(value)}: it must be a finite number"
    elif isinstance(value, tuple):
        for item in value:
            if isinstance(item, (int, float)):
                found = _problem(where, name, item)
                if found:
                    return found
    return None


def _figures_of(obj: Any, where: str) -> str | None:
    for item in dataclasses.fields(obj):
        value = getattr(obj, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if item.name == "spec":
                continue
            found = _figures_of(value, f"{where}{item.name}.")
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            rows = (_figures_of(row, f"{where}{item.name}[].") for row in value)
            found = next((f for f in rows if f is not None), None)
        elif isinstance(value, dict):
            found = next(
                (f for k, v in value.items() if (f := _problem(where, f"{item.name}.{k}", v))),
                None,
            )
        else:
            found = _problem(where, item.name, value)
        if found is not None:
            return found
    return None


def check_figures(pin: PinDocument) -> str | None:
    """The first figure of ``pin`` that is not finite or out of range, said as
    ``measured.peak_worst_bytes is inf: ...`` (None: every figure holds)."""
    return _figures_of(pin, "")
