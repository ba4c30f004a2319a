"""`budgettune.search(...)` without trials: the builder's reference, refusals, the package."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import budgettune
from budgettune.api import builder_reference
from budgettune.errors import StudyFileError, UsageError
from budgettune.workloads import tiny_gpt


def top_level_builder(device: object) -> None:  # a builder a fresh process can import
    raise NotImplementedError


def test_a_module_function_is_passed_by_module_and_its_import_root() -> None:
    reference, root = builder_reference(top_level_builder)
    assert reference == f"{__name__}:top_level_builder"
    # the folder a fresh process must import the module's top-level package from
    assert root is not None
    assert (Path(root) / Path(*__name__.split("."))).with_suffix(".py") == Path(__file__)
    assert builder_reference(tiny_gpt.build) == (
        "budgettune.workloads.tiny_gpt:build",
        str(Path(tiny_gpt.__file__).parents[2]),
    )
    assert builder_reference("builtin:tiny-gpt") == ("builtin:tiny-gpt", None)


def test_builders_a_fresh_process_cannot_import_are_refused_in_one_line() -> None:
    def nested(device: object) -> None: ...

    cell = types.ModuleType("__ipython_cell__")  # what a notebook cell's function points at
    exec("def build(device):\n    return None\n", cell.__dict__)
    sys.modules[cell.__name__] = cell
    try:
        for build, says in (
            (lambda device: None, "not a top-level function"),
            (nested, "not a top-level function"),
            (cell.__dict__["build"], "notebook cell"),
            (42, "must be a workload builder"),
        ):
            with pytest.raises(UsageError) as err:
                builder_reference(build)  # type: ignore[arg-type]
            assert says in str(err.value) and "\n" not in str(err.value), err.value
    finally:
        del sys.modules[cell.__name__]


def test_bad_keys_and_values_are_one_line_errors_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "pin.json"
    for settings, says in (
        ({"num_trials": -1}, "num_trials must be"),
        ({"space": {"ac_every": "1"}}, "space.ac_every must be"),
        ({"gpus": [0], "device": "cpu"}, "gpus runs on GPUs; drop device='cpu'"),
    ):
        with pytest.raises((StudyFileError, UsageError)) as err:
            budgettune.search(top_level_builder, "1GB", output=out, **settings)
        assert says in str(err.value) and "\n" not in str(err.value), err.value
    assert not out.exists() and not list(tmp_path.iterdir())
    assert "PYTHONPATH" not in os.environ or str(Path(__file__).parents[2]) not in os.environ[
        "PYTHONPATH"
    ].split(os.pathsep)


def test_search_is_a_typed_function_and_import_stays_light(tmp_path: Path) -> None:
    """Issue 47: a plain function (its signature, its docstring), not a package made callable;
    a misspelt keyword is Python's own TypeError naming it (and a type checker's error)."""
    import inspect

    from budgettune.api import search

    assert budgettune.search is search and inspect.isfunction(budgettune.search)
    parameters = inspect.signature(budgettune.search).parameters
    assert {"num_trials", "storage_url", "study_name", "space", "global_batch"} <= set(parameters)
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    assert "max_mem" in (budgettune.search.__doc__ or "")
    with pytest.raises(TypeError, match="trails"):
        budgettune.search("builtin:tiny-gpt", "1GB", trails=3)  # type: ignore[call-arg]
    assert list(tmp_path.iterdir()) == []
    code = (
        "import sys, budgettune; light = 'optuna' not in sys.modules and "
        "'sqlalchemy' not in sys.modules; print(light, callable(budgettune.search))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_every_study_file_key_is_a_keyword_of_the_search() -> None:
    """The keywords are written out (for type checkers), so a new study key must be added to
    them too: the study file's own arguments (workload, its options, the limit) aside."""
    import inspect

    from budgettune.study.study_schema import StudyTable

    own = {"workload": "build", "workload_options": "options", "max_mem": "max_mem"}
    parameters = set(inspect.signature(budgettune.search).parameters)
    keys = {own.get(key, key) for key in StudyTable.model_fields}
    assert keys <= parameters, sorted(keys - parameters)
