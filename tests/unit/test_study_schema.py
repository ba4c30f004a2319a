"""Issue 29: every study-file value is validated by type once, against one schema: a wrong type,
an out-of-range or a non-finite value is one line and exit 2, before any trial, and the study
database is left byte-identical. The bad values are made from each key's declared schema, so a
key added to the schema is fuzzed without touching this file."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
from click.testing import CliRunner

from budgettune.cli import app
from budgettune.study.study_file import read_study_file
from budgettune.study.study_schema import TABLES

# The click command built once, run with click's own runner: typer's runner rebuilds it on
# every call (~0.1 s, ten times what a refused search takes), and the fuzz makes hundreds.
COMMAND = typer.main.get_command(app)
runner = CliRunner()
BASE = {"workload": "builtin:tiny-gpt", "device": "cpu", "max_mem": "1GB"}
INF, NAN = math.inf, math.nan
DATE = datetime.date(2026, 11, 27)
WRONG_TYPES: tuple[Any, ...] = ("text", 3, 1.5, True, [1], {"a": 1}, DATE)
#: A valid value for every key (the fuzz would pass vacuously if the schema refused everything).
GOOD: dict[str, Any] = {
    "workload": "builtin:tiny-gpt",
    "workload_options": {"n_layers": 2, "dropout": 0.0, "name": "x", "flag": True, "sizes": [1]},
    "device": "cpu",
    "max_mem": "1GB",
    "max_host_mem": "8GiB",
    "mem_metric": "allocated",
    "num_trials": 0,
    "study_name": "tiny-gpt_v1.2",
    "storage_url": "bt.db",
    "top_k": 1,
    "reverify_runs": 1,
    "margin": 0,
    "trial_timeout_s": 60,
    "runs_dir": "runs",
    "compile_cache": False,
    "sampler": "gp",
    "sampler_seed": 4294967295,
    "nproc_per_node": 1,
    "collective_timeout_s": 30.5,
    "trials_per_gpu": 1,
    "global_batch": 8,
    "target": "",
    "space.micro_batches": [1, 2, 4],
    "fix.micro_batch": 2,
    "fix.accum_steps": 2,
    "space.activation_memory_budget_range": [0, 1.0],
    "space.removable_ops": ["aten.add"],
    "space.addable_ops": ["aten.mm", "prims.convert_element_type"],
    "space.knapsack_solvers": ["dp", "greedy"],
    "space.runtime_estimators": ["flops"],
    "space.compile_modes": ["default"],
    "space.compile_backend": "aot_eager_decomp_partition",
    "space.block_ac_every": [0, 1, 124],
    "space.block_ac_policies": ["full", "op"],
    "space.optimizer_impls": ["as_written", "fused"],
    "space.cuda_alloc_confs": ["", "expandable_segments:True"],
    "fix.activation_memory_budget": 0.5,
    "fix.knapsack_solver": "dp",
    "fix.runtime_estimator": "flops",
    "fix.compile_mode": "default",
    "fix.compile_backend": "aot_eager_decomp_partition",
    "fix.block_ac_every": 2,
    "fix.block_ac_policy": "op",
    "fix.optimizer_impl": "fused",
    "fix.cuda_alloc_conf": "expandable_segments:True",
    "space.aggressive_recomputations": [False, True],
    "fix.aggressive_recomputation": True,
    "space.offload_every": [0, 1, 2],
    "fix.offload_every": 2,
    "space.compile_scopes": ["model", "blocks"],
    "fix.compile_scope": "blocks",
    "trial.warmup_steps": 1,
    "trial.timed_steps": 1,
    "trial.seed": 0,
}
#: Bad values a key's schema cannot tell of (what the value means, not its type).
MEANING: dict[str, tuple[Any, ...]] = {
    "max_mem": ("banana", "0", "-5GB", "0.9MiB", 120, "999999999999999999999PB", "", INF, NAN),
    "max_host_mem": ("banana", "0", "-5GB", "0.9MiB", 120, "", INF, NAN),
    "device": ("cuda:-1", "gpu", "cpu:0", ""),
    "trials_per_gpu": (2,),  # several trials share a GPU: not on the CPU
    "study_name": ("../x", "/abs/path", ".hidden", "-x", "a b", "a/b", "x" * 201, "`x`", ""),
    "workload": ("",),
    "storage_url": ("",),
    "runs_dir": ("",),
    "workload_options": ({"not an identifier": 1}, {"x": DATE}, {"x": INF}, {"x": {"y": 1}}),
    "space.activation_memory_budget_range": (
        [0.5],
        [0.1, 0.2, 0.3],
        [0.9, 0.1],
        [[0.1], [0.9]],
        [0, NAN],
    ),
    "space.removable_ops": (["add"], ["aten.add; rm -rf /"], "aten.add"),
    "space.addable_ops": (["mm"], [""]),
    "space.cuda_alloc_confs": (["$(id)"], ["expandable_segments"], []),
    "fix.cuda_alloc_conf": ("$(id)", "a:b:c d"),
}


def _wrong_values(schema: Mapping[str, Any]) -> Iterator[Any]:
    """Wrong types, out-of-range and non-finite values for one key's JSON schema."""
    schema = next((s for s in schema.get("anyOf", ()) if s.get("type") != "null"), schema)
    kind = schema.get("type")
    if kind in ("integer", "number"):
        yield from (v for v in WRONG_TYPES if not isinstance(v, (int, float)) or v is True)
        yield from ("3", INF, -INF, NAN)
        if kind == "integer":
            yield 1.5
        for bound, step in (("minimum", -1), ("exclusiveMinimum", 0), ("maximum", 1)):
            if bound in schema:
                yield schema[bound] + step
        if "exclusiveMaximum" in schema:
            yield schema["exclusiveMaximum"]
    elif kind == "string":
        yield from (v for v in WRONG_TYPES if not isinstance(v, str))
        if "enum" in schema:
            yield from ("not-a-choice", schema["enum"][0].upper() + "!")
    elif kind == "boolean":
        yield from ("no", "true", 1, 0, 1.5, [True], DATE)
    elif kind == "array":
        yield from ("text", 3, True, {"a": 1}, [[1]], [DATE], [INF], [NAN])
        item = schema.get("items", {})
        yield from ([bad] for bad in _wrong_values(item) if not isinstance(bad, list))
        if schema.get("minItems"):
            yield []
    elif kind == "object":
        yield from ("text", 3, 1.5, True, [1], INF)


def _cases() -> Iterator[tuple[str, Any]]:
    for table, model in TABLES.items():
        properties = model.model_json_schema()["properties"]
        for key, schema in properties.items():
            name = f"{table}.{key}" if table else key
            for value in (*_wrong_values(schema), *MEANING.get(name, ())):
                yield name, value


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


def _study_file(path: Path, values: Mapping[str, Any]) -> Path:
    """``values`` (``space.budget`` for a key of a table) as a TOML file."""
    top = [f"{key} = {_toml(v)}" for key, v in values.items() if "." not in key]
    tables: dict[str, list[str]] = {}
    for name, value in values.items():
        if "." in name:
            table, key = name.split(".", 1)
            tables.setdefault(table, []).append(f"{key} = {_toml(value)}")
    lines = top + [f"[{t}]\n" + "\n".join(rows) for t, rows in tables.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def study_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_db: bytes) -> Path:
    """A real study database (created with budgettune's tables) in a working folder."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "bt.db"
    db.write_bytes(empty_db)
    return db


def test_the_good_file_names_every_key_and_passes(tmp_path: Path) -> None:
    declared = {f"{t}.{k}" if t else k for t, m in TABLES.items() for k in m.model_fields}
    assert declared - {"space", "fix", "trial"} == set(GOOD)
    assert read_study_file(_study_file(tmp_path / "good.toml", GOOD))["space"][
        "block_ac_every"
    ] == [
        0,
        1,
        124,
    ]


def test_every_key_refuses_wrong_types_out_of_range_and_non_finite_values(
    tmp_path: Path, study_db: Path
) -> None:
    before = study_db.read_bytes()
    cases = list(_cases())
    assert len({name for name, _ in cases}) == len(GOOD) + 3  # + the space, fix, trial tables
    failures = []
    for index, (name, value) in enumerate(cases):
        path = _study_file(tmp_path / f"case{index}.toml", {**BASE, name: value})
        result = runner.invoke(COMMAND, ["search", str(path), "--storage", str(study_db)])
        lines = result.stderr.strip().splitlines()
        key = name.rsplit(".", 1)[-1]
        named = key in result.stderr or key.replace("_", "-") in result.stderr
        if result.exit_code != 2 or len(lines) != 1 or not named:
            failures.append(f"{name} = {value!r}: exit {result.exit_code}, {result.stderr!r}")
    assert not failures, "\n".join(failures)
    assert study_db.read_bytes() == before
    assert not (tmp_path / "budgettune-runs").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('trials = "three"', "trials must be an integer >= 0 and <= 1000000, got 'three'"),
        ("trials = inf", "trials must be an integer >= 0 and <= 1000000, got inf"),
        ('[trial]\ntimed_steps = "x"', "trial.timed_steps must be an integer >= 1 and <= 10000"),
        ("[space]\nbudget = [[0.1], [0.9]]", "space.budget must be [low, high] with 0 <= low"),
        ("storage = 42", "storage must be a non-empty string, got 42"),
        ('sampler_seed = "abc"', "sampler_seed must be an integer >= 0 and <= 4294967295"),
        ("collective_timeout = -1", "collective_timeout must be a finite number > 0"),
        ('[space]\nac_every = "124"', "space.ac_every must be a list of one or more integers"),
        ('compile_cache = "no"', "compile_cache must be true or false, got 'no'"),
        ("top_k = 1.9", "top_k must be an integer >= 1 and <= 1000000, got 1.9"),
        ('[fix]\ncuda_alloc_conf = "$(id)"', "fix.cuda_alloc_conf must be PYTORCH_CUDA_ALLOC"),
        ('study = "../x"', "study must be a study name of 1 to 200 letters, digits, '.', '_'"),
        ("trails = 3", "unknown key 'trails'; known keys: workload, workload_options"),
        (
            '[space]\nmode = ["default"]',
            "unknown key 'space.mode'; known keys: space.compile_modes",
        ),
    ],
)
def test_the_issues_study_file_cases_say_which_key_and_what_it_allows(
    tmp_path: Path, study_db: Path, line: str, said: str
) -> None:
    before = study_db.read_bytes()
    path = tmp_path / "study.toml"
    path.write_text('max_mem = "1GB"\ndevice = "cpu"\n' + line + "\n")
    result = runner.invoke(COMMAND, ["search", str(path), "--storage", str(study_db)])
    assert result.exit_code == 2, result.output
    [error] = result.stderr.strip().splitlines()
    assert error.startswith(f"error: {path}: ") and said in error, error
    assert study_db.read_bytes() == before


@pytest.mark.parametrize(
    "make", ["/dev/zero", "folder", "fifo", "huge"], ids=lambda m: m.strip("/")
)
def test_a_study_file_that_is_no_regular_small_file_is_refused_unread(
    tmp_path: Path, study_db: Path, make: str
) -> None:
    import os

    path = Path(make)
    if make == "folder":
        path = tmp_path / "folder.toml"
        path.mkdir()
    elif make == "fifo":
        path = tmp_path / "fifo.toml"
        os.mkfifo(path)  # no writer: a blocking open would hang the test
    elif make == "huge":
        path = tmp_path / "huge.toml"
        path.write_text('max_mem = "1GB"\n' + "#" * 2**20 + "\n")
    result = runner.invoke(COMMAND, ["search", str(path), "--storage", str(study_db)])
    assert result.exit_code == 2, result.output
    assert "not a study file" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_search_setting_has_one_name_in_the_study_file_the_flags_and_search_spec() -> None:
    """Issue 31: a study key is the `SearchSpec` field of that name and the `search` flag of
    that name; the few that differ are translated in one place each (named here), so a setting
    added to one of the three and not the others fails this test."""
    import dataclasses

    import typer.main

    from budgettune.cli import app
    from budgettune.study import study_file
    from budgettune.study.spec import SearchSpec
    from budgettune.study.study_schema import StudyTable

    spec_fields = {f.name for f in dataclasses.fields(SearchSpec)}
    keys = set(StudyTable.model_fields)
    translated = {  # study key -> SearchSpec field (build_search_spec)
        "max_mem": "max_mem_bytes", "max_host_mem": "max_host_mem_bytes",
        "fix": "base", "trial": "base",
    }  # fmt: skip
    assert keys - spec_fields == set(translated)
    assert spec_fields - keys == set(translated.values())
    assert set(study_file._PASSED) == (keys & spec_fields) - {"workload", "workload_options",
        "device", "space"}  # fmt: skip
    params = {p.name: p for p in typer.main.get_command(app).commands["search"].params}
    by_other_name = {  # study key -> the flags that set it
        "workload_options": {"option"}, "trial": {"warmup_steps", "timed_steps"},
    }  # fmt: skip
    for key in keys - {"space"}:
        assert by_other_name.get(key, {key}) <= set(params), key
    # the option of a key is made from it: its name, its help, its old spelling too
    for key in keys - {"space", "fix", "trial", "workload_options"}:
        param = params[key]
        assert "--" + key.replace("_", "-") in param.opts, key
        description = StudyTable.model_fields[key].description
        assert description is not None and description[1:] in (param.help or ""), key
    assert (
        "--trials" in params["num_trials"].opts
        and "--no-cache" in params["compile_cache"].secondary_opts
    )
