"""Studies as files: a TOML study file, merged with command-line flags, becomes a `SearchSpec`.

    workload = "builtin:tiny-gpt"
    device = "cpu"
    max_mem = "120MB"
    trials = 8
    [space]
    modes = ["default"]
    [fix]
    knapsack_solver = "dp"

Flags override the file; the file overrides the defaults. Every key is validated once, by type
and range, against `budgettune.search.study_schema`; an unknown key is an error.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgettune.errors import StudyFileError, UsageError
from budgettune.search.space import SearchSpace
from budgettune.search.spec import MAX_LIMIT_BYTES, MIN_LIMIT_BYTES, SearchSpec
from budgettune.search.study_schema import check_study_values
from budgettune.trial.spec import DEFAULT_COLLECTIVE_TIMEOUT_S, TrialSpec
from budgettune.units import parse_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SPACE_FIELDS = {
    "budget": "budget_range",
    "remove_ops": "removable_ops",
    "add_ops": "addable_ops",
    "solvers": "knapsack_solvers",
    "estimators": "runtime_estimators",
    "modes": "compile_modes",
    "backend": "compile_backend",
    "ac_every": "block_ac_every",
    "ac_policies": "block_ac_policies",
    "optimizer_impls": "optimizer_impls",
    "alloc_confs": "cuda_alloc_confs",
}
"""The `SearchSpace` field each ``[space]`` key narrows."""
MAX_STUDY_FILE_BYTES = 2**20
"""A study file is a few hundred bytes; one past this is not a study file (``/dev/zero``)."""


def read_study_file(path: str | Path) -> dict[str, Any]:
    """Parse a study TOML file and validate every value against `study_schema`.

    Raises:
        StudyFileError: missing, not a regular file, too large, unparsable, with an unknown key
            (named, with the known ones) or a value of the wrong type or range.
    """
    source = Path(path)
    text = _read_bounded(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudyFileError(f"{source}: not a valid TOML study file ({exc})") from None
    check_study_values(str(source), data)
    return data


def _read_bounded(source: Path) -> str:
    """The file's text, read only if it is a regular file of at most `MAX_STUDY_FILE_BYTES`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StudyFileError(f"{source}: no such study file") from None
    except OSError as exc:
        raise StudyFileError(f"{source}: cannot read the study file ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StudyFileError(f"{source}: not a study file (not a regular file)")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(MAX_STUDY_FILE_BYTES + 1)
        except OSError as exc:
            raise StudyFileError(f"{source}: cannot read the study file ({exc})") from None
    if len(raw) > MAX_STUDY_FILE_BYTES:
        raise StudyFileError(
            f"{source}: not a study file (larger than {MAX_STUDY_FILE_BYTES // 2**10} KiB)"
        )
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise StudyFileError(f"{source}: not a valid TOML study file ({exc})") from None


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


def build_search_spec(values: Mapping[str, Any], *, default_device: str) -> SearchSpec:
    """Turn merged study values into a validated `SearchSpec`.

    Raises:
        UsageError: a missing limit, a bad size, an invalid space or value.
    """
    from budgettune.search.study import default_study_name

    workload = values.get("workload", "builtin:tiny-gpt")
    device = values.get("device") or default_device
    if values.get("max_mem") is None:
        raise UsageError(
            "--max-mem is required (e.g. --max-mem 20GB), on the command line or in the study file"
        )
    max_mem = parse_bytes(
        values["max_mem"], what="--max-mem", min_bytes=MIN_LIMIT_BYTES, max_bytes=MAX_LIMIT_BYTES
    )
    metric = values.get("mem_metric", "device")
    options = dict(values.get("workload_options", {}))

    space_values: dict[str, Any] = {}
    for key, value in values.get("space", {}).items():
        field_name = SPACE_FIELDS[key]
        if field_name == "budget_range":
            if not (isinstance(value, (list, tuple)) and len(value) == 2):
                raise UsageError("space.budget must be [low, high], e.g. [0.0, 1.0]")
            space_values["budget_low"], space_values["budget_high"] = value
        elif field_name == "compile_backend":
            space_values[field_name] = value
        else:
            space_values[field_name] = tuple(value)
    space_values["fixed"] = dict(values.get("fix", {}))
    space = SearchSpace.for_device(device, **space_values)

    base = TrialSpec(
        compile_backend=space.fixed.get("compile_backend", space.compile_backend),
        **values.get("trial", {}),
    )
    nproc = values.get("nproc_per_node", 1)
    study = values.get("study") or default_study_name(
        workload, options, device, max_mem, metric, nproc_per_node=nproc
    )
    return SearchSpec(
        workload=workload,
        workload_options=options,
        device=device,
        max_mem_bytes=max_mem,
        mem_metric=metric,
        num_trials=values.get("trials", 20),
        study_name=study,
        storage_url=values.get("storage"),
        space=space,
        base=base,
        top_k=values.get("top_k", 3),
        reverify_runs=values.get("reverify", 3),
        margin=values.get("margin", 0.03),
        trial_timeout_s=values.get("timeout", 900.0),
        runs_dir=values.get("runs_dir", "budgettune-runs"),
        compile_cache=values.get("compile_cache", True),
        sampler_seed=values.get("sampler_seed"),
        nproc_per_node=nproc,
        collective_timeout_s=values.get("collective_timeout", DEFAULT_COLLECTIVE_TIMEOUT_S),
    )
