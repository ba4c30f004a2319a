"""Studies as files: a TOML study file, merged with command-line flags, becomes a `SearchSpec`.

    workload = "builtin:tiny-gpt"
    device = "cpu"
    max_mem = "120MB"
    trials = 8
    [space]
    modes = ["default"]
    [fix]
    knapsack_solver = "dp"

Flags override the file; the file overrides the defaults. An unknown key is an error.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgettune.errors import StudyFileError, UsageError
from budgettune.search.space import SearchSpace
from budgettune.search.spec import SearchSpec
from budgettune.trial.spec import DEFAULT_COLLECTIVE_TIMEOUT_S, TrialSpec
from budgettune.units import parse_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOP_KEYS = {
    "workload": "workload reference",
    "workload_options": "table of builder options",
    "device": "cpu, cuda or cuda:N",
    "max_mem": "memory limit, e.g. 20GB",
    "mem_metric": "device, reserved or allocated",
    "trials": "trials per invocation",
    "study": "study name",
    "storage": "SQLAlchemy URL or SQLite path",
    "top_k": "configurations re-verified",
    "reverify": "re-measurements per configuration",
    "margin": "fits when peak x (1 + margin) is within max_mem (search, re-verification, pin)",
    "timeout": "seconds per trial",
    "runs_dir": "folder for trial logs and caches",
    "compile_cache": "reuse compiled code per partition variant",
    "sampler_seed": "seed of the sampler",
    "nproc_per_node": "ranks per trial (above 1: sharded with FSDP2 under torchrun)",
    "collective_timeout": "seconds a rank's collective may wait before it fails",
    "space": "table: the search space",
    "fix": "table: dimensions held at one value",
    "trial": "table: warmup_steps, timed_steps, seed",
}
SPACE_KEYS = {
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
TRIAL_KEYS = ("warmup_steps", "timed_steps", "seed")


def read_study_file(path: str | Path) -> dict[str, Any]:
    """Parse and check the keys of a study TOML file.

    Raises:
        StudyFileError: missing, unparsable, or with an unknown key (named, with the known ones).
    """
    source = Path(path)
    try:
        data = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise StudyFileError(f"{source}: no such study file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise StudyFileError(f"{source}: not a valid TOML study file ({exc})") from None
    _check_keys(source, "", data, TOP_KEYS)
    for table, known in (("space", SPACE_KEYS), ("trial", dict.fromkeys(TRIAL_KEYS, ""))):
        if table in data:
            if not isinstance(data[table], dict):
                raise StudyFileError(f"{source}: [{table}] must be a table")
            _check_keys(source, f"{table}.", data[table], known)
    for table in ("fix", "workload_options"):
        if table in data and not isinstance(data[table], dict):
            raise StudyFileError(f"{source}: [{table}] must be a table")
    return data


def _check_keys(
    source: Path, prefix: str, data: Mapping[str, Any], known: Mapping[str, Any]
) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise StudyFileError(
            f"{source}: unknown key {prefix}{unknown[0]!r}; known keys: "
            + ", ".join(f"{prefix}{k}" for k in known)
        )


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
    max_mem = parse_bytes(values["max_mem"], what="--max-mem")
    metric = values.get("mem_metric", "device")
    options = dict(values.get("workload_options", {}))

    space_values: dict[str, Any] = {}
    for key, value in values.get("space", {}).items():
        field_name = SPACE_KEYS[key]
        if field_name == "budget_range":
            if not (isinstance(value, (list, tuple)) and len(value) == 2):
                raise UsageError("space.budget must be [low, high], e.g. [0.0, 1.0]")
            space_values["budget_low"], space_values["budget_high"] = (
                float(value[0]),
                float(value[1]),
            )
        elif field_name == "compile_backend":
            space_values[field_name] = str(value)
        elif field_name == "block_ac_every":
            space_values[field_name] = tuple(int(v) for v in value)
        else:
            space_values[field_name] = tuple(str(v) for v in value)
    space_values["fixed"] = dict(values.get("fix", {}))
    space = SearchSpace.for_device(device, **space_values)

    steps: dict[str, Any] = {k: int(v) for k, v in values.get("trial", {}).items()}
    base = TrialSpec(
        compile_backend=space.fixed.get("compile_backend", space.compile_backend), **steps
    )
    study = values.get("study") or default_study_name(workload, options, device, max_mem, metric)
    nproc = int(values.get("nproc_per_node", 1))
    if nproc > 1 and not values.get("study"):
        study = f"{study}-x{nproc}"
    return SearchSpec(
        workload=workload,
        workload_options=options,
        device=device,
        max_mem_bytes=max_mem,
        mem_metric=metric,
        num_trials=int(values.get("trials", 20)),
        study_name=study,
        storage_url=values.get("storage"),
        space=space,
        base=base,
        top_k=int(values.get("top_k", 3)),
        reverify_runs=int(values.get("reverify", 3)),
        margin=float(values.get("margin", 0.03)),
        trial_timeout_s=float(values.get("timeout", 900.0)),
        runs_dir=str(values.get("runs_dir", "budgettune-runs")),
        compile_cache=bool(values.get("compile_cache", True)),
        sampler_seed=values.get("sampler_seed"),
        nproc_per_node=int(values.get("nproc_per_node", 1)),
        collective_timeout_s=float(values.get("collective_timeout", DEFAULT_COLLECTIVE_TIMEOUT_S)),
    )
