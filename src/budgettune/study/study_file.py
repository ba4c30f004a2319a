"""Studies as files: a TOML study file, merged with command-line flags, becomes a `SearchSpec`.

    workload = "builtin:tiny-gpt"
    device = "cpu"
    max_mem = "120MB"
    num_trials = 8
    [space]
    compile_modes = ["default"]
    [fix]
    knapsack_solver = "dp"

Top-level keys are `SearchSpec`'s field names, ``[space]`` keys each knob's plural and
``[fix]`` keys its name (`budgettune.trial.knobs`), ``[trial]`` the step settings.

Flags override the file; the file overrides the defaults. Every key is validated once, by type
and range, against `budgettune.study.study_schema`; an unknown key is an error.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgettune.errors import StudyFileError, UsageError, one_line, shown_path, shown_value
from budgettune.study.space import SearchSpace
from budgettune.study.spec import (
    DEFAULT_WORKLOAD,
    MAX_LIMIT_BYTES,
    MIN_LIMIT_BYTES,
    SEARCH_DEFAULTS,
    SearchSpec,
)
from budgettune.study.study import default_study_name
from budgettune.study.study_schema import check_study_values, new_spelling
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec
from budgettune.units import parse_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

BUDGET = KNOB_BY_NAME["activation_memory_budget"]
MAX_STUDY_FILE_BYTES = 2**20
"""A study file is a few hundred bytes; one past this is not a study file (``/dev/zero``)."""


def read_study_file(path: str | Path) -> dict[str, Any]:
    """Parse a study TOML file and validate every value against `study_schema`.

    Returns:
        The values, keys spelled as today (a key of before issue 31 renamed: `OLD_KEYS`).

    Raises:
        StudyFileError: missing, not a regular file, too large, unparsable, with an unknown key
            (named, with the known ones) or a value of the wrong type or range.
    """
    source = Path(path)
    shown = shown_path(str(source))  # a newline in the name must not split the line (P9-8)
    text = _read_bounded(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudyFileError(f"{shown}: not a valid TOML study file ({exc})") from None
    except (ValueError, RecursionError) as exc:  # issue 48: a 5000-digit integer, deep nesting
        what = "nested too deep" if isinstance(exc, RecursionError) else one_line(exc)
        raise StudyFileError(f"{shown}: not a study file this reads ({what})") from None
    try:
        return check_study_values(shown, data)
    except RecursionError:
        raise StudyFileError(f"{shown}: not a study file this reads (nested too deep)") from None


def _read_bounded(source: Path) -> str:
    """The file's text, read only if it is a regular file of at most `MAX_STUDY_FILE_BYTES`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StudyFileError(f"{shown_path(str(source))}: no such study file") from None
    except OSError as exc:
        raise StudyFileError(
            f"{shown_path(str(source))}: cannot read the study file ({exc.strerror})"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StudyFileError(f"{shown_path(str(source))}: not a study file (not a regular file)")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(MAX_STUDY_FILE_BYTES + 1)
        except OSError as exc:
            raise StudyFileError(
                f"{shown_path(str(source))}: cannot read the study file ({exc})"
            ) from None
    if len(raw) > MAX_STUDY_FILE_BYTES:
        raise StudyFileError(
            f"{shown_path(str(source))}: not a study file "
            f"(larger than {MAX_STUDY_FILE_BYTES // 2**10} KiB)"
        )
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise StudyFileError(
            f"{shown_path(str(source))}: not a valid TOML study file ({exc})"
        ) from None


def merge(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flags (those not None) override the file, table by table."""
    merged: dict[str, Any] = {
        k: (dict(v) if isinstance(v, dict) else v) for k, v in file_values.items()
    }
    for key, value in flags.items():
        if value is None:
            continue
        if key in ("space", "fix", "trial", "workload_options") and isinstance(value, dict):
            table = dict(merged.get(key, {}))
            table.update({k: v for k, v in value.items() if v is not None})
            merged[key] = table
        else:
            merged[key] = value
    return merged


_PASSED = (
    "mem_metric",
    "num_trials",
    "study_name",
    "storage_url",
    "top_k",
    "reverify_runs",
    "margin",
    "trial_timeout_s",
    "runs_dir",
    "compile_cache",
    "sampler",
    "sampler_seed",
    "nproc_per_node",
    "collective_timeout_s",
    "trials_per_gpu",
    "global_batch",
    "target",
)
"""Study keys that are `SearchSpec` fields as they are (a key not given takes the field's
default, declared once, in `SearchSpec`)."""


def build_search_spec(values: Mapping[str, Any], *, default_device: str) -> SearchSpec:
    """Turn study values (a study file's, merged with flags, or a Python caller's) into a
    validated `SearchSpec`. Keys are `SearchSpec`'s field names (``max_mem``: the size with
    its unit), ``[space]`` keys the knobs' plurals; old keys (`OLD_KEYS`) are read too.

    Raises:
        UsageError: a missing limit, a bad size, an invalid space or value.
    """
    values, _ = new_spelling(values)
    workload = values.get("workload", DEFAULT_WORKLOAD)
    if workload is None:
        workload = DEFAULT_WORKLOAD
    if not isinstance(workload, str) or not workload.strip():  # "" was the default (P9-7)
        raise UsageError(f"workload must be a non-empty reference, got {shown_value(workload)}")
    device = values.get("device")
    if device is None:  # not `or`: an empty device is refused by SearchSpec, not defaulted
        device = default_device
    if values.get("max_mem") is None:
        raise UsageError(
            "--max-mem is required (e.g. --max-mem 20GB), on the command line or in the study file"
        )
    max_mem = parse_bytes(
        values["max_mem"], what="--max-mem", min_bytes=MIN_LIMIT_BYTES, max_bytes=MAX_LIMIT_BYTES
    )
    host_mem = values.get("max_host_mem")
    if host_mem is not None:
        host_mem = parse_bytes(
            host_mem, what="--max-host-mem", min_bytes=MIN_LIMIT_BYTES, max_bytes=MAX_LIMIT_BYTES
        )
    options = dict(values.get("workload_options") or {})
    passed = {key: values[key] for key in _PASSED if values.get(key) is not None}

    space_values: dict[str, Any] = {}
    for key, value in (values.get("space") or {}).items():
        if key == BUDGET.plural:
            if not (isinstance(value, (list, tuple)) and len(value) == 2):
                raise UsageError(f"space.{key} must be [low, high], e.g. [0.0, 1.0]")
            space_values["budget_low"], space_values["budget_high"] = value
        elif key == "compile_backend" or isinstance(value, str):  # micro_batches "1..32"
            space_values[key] = value
        else:
            space_values[key] = tuple(value)
    space_values["fixed"] = dict(values.get("fix") or {})
    space = SearchSpace.for_device(device, **space_values)

    base = TrialSpec(
        compile_backend=space.fixed.get("compile_backend", space.compile_backend),
        **(values.get("trial") or {}),
    )
    if "study_name" not in passed:
        passed["study_name"] = default_study_name(
            workload,
            options,
            device,
            max_mem,
            passed.get("mem_metric", SEARCH_DEFAULTS["mem_metric"]),
            nproc_per_node=passed.get("nproc_per_node", SEARCH_DEFAULTS["nproc_per_node"]),
        )
    return SearchSpec(
        workload=workload,
        workload_options=options,
        device=device,
        max_mem_bytes=max_mem,
        max_host_mem_bytes=host_mem,
        space=space,
        base=base,
        **passed,
    )
