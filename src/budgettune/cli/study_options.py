"""``budgettune search``'s options made from the study file's keys (`study.study_schema`).

A study key is a `SearchSpec` field, and its option is that name with dashes
(``num_trials`` -> ``--num-trials``), typed by the key's schema, with the key's description as
its help and the field's default (`SEARCH_DEFAULTS`) appended; the spelling before issue 31
(``--trials``, ``--study``, ...: `OLD_KEYS`) is still accepted. The keys that are tables have
their own options: ``--option`` (``workload_options``), the knobs' plurals (``[space]``,
`cli.knob_options`), ``--fix`` (``[fix]``) and the step counts (``[trial]``,
`TRIAL_OPTIONS`). A command declares a ``study: dict`` parameter; `with_options` replaces it
with these options and hands their values (None: not given) to the command by key.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from budgettune.cli.app import STORAGE_ENV
from budgettune.study.spec import SEARCH_DEFAULTS
from budgettune.study.study_schema import OLD_KEYS, TABLES, StudyTable

_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_TYPES = {"integer": int, "number": float, "string": str, "boolean": bool}
ALIASES = {"workload": ("-w",), "sampler_seed": ("--seed",)}
"""Other names of an option: short ones, and ``--seed`` (in a study file ``seed`` would be
ambiguous with ``[trial]`` ``seed``, so it is no old key there)."""
OFF_FLAG = {"compile_cache": "--no-cache"}
"""A boolean key's option to turn it off, where it is not ``--no-NAME``."""
TRIAL_OPTIONS = ("warmup_steps", "timed_steps")
"""The ``[trial]`` keys that have an option (``seed`` is the sampler's ``--seed``)."""
TABLE_KEYS = ("workload_options", "space", "fix", "trial")
"""Study keys that are tables: set by their own options, not one each."""


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _kind(schema: dict[str, Any]) -> type:
    """The Python type of a key's option: the one JSON type of its schema (str where a key
    takes several, e.g. a size as text or a number)."""
    kinds = {s.get("type") for s in schema.get("anyOf", [schema])} - {"null"}
    return _TYPES[kinds.pop()] if len(kinds) == 1 else str


def _help(key: str, description: str) -> str:
    text = description[0].upper() + description[1:]
    if key in SEARCH_DEFAULTS and "default" not in text:
        default = SEARCH_DEFAULTS[key]
        shown = (
            "none"
            if default is None
            else f"{default:g}"
            if isinstance(default, float)
            else default
        )
        text += f" (default {shown})"
    return text + ("" if text.endswith(".") else ".")


def _parameter(key: str, schema: dict[str, Any]) -> inspect.Parameter:
    kind = _kind(schema)
    old = [_flag(o) for o, new in OLD_KEYS[""].items() if new == key]
    if kind is bool:
        names = [f"{_flag(key)}/{OFF_FLAG.get(key, '--no-' + _flag(key)[2:])}"]
    else:
        names = [_flag(key), *old, *ALIASES.get(key, ())]
    option = typer.Option(
        *names,
        help=_help(key, schema["description"]),
        show_default=False,
        envvar=STORAGE_ENV if key == "storage_url" else None,  # as every command reads it
        show_envvar=False,
    )
    return inspect.Parameter(
        key, _KEYWORD, default=None, annotation=Annotated[kind | None, option]
    )


def study_parameters() -> list[inspect.Parameter]:
    """One option per study key that is not a table, then the ``[trial]`` step counts."""
    top = StudyTable.model_json_schema()["properties"]
    trial = TABLES["trial"].model_json_schema()["properties"]
    return [_parameter(key, schema) for key, schema in top.items() if key not in TABLE_KEYS] + [
        _parameter(key, trial[key]) for key in TRIAL_OPTIONS
    ]


def study_flags(given: dict[str, Any]) -> dict[str, Any]:
    """The values of `study_parameters` as study values (``[trial]`` keys in their table)."""
    values = {key: value for key, value in given.items() if key not in TRIAL_OPTIONS}
    values["trial"] = {key: given[key] for key in TRIAL_OPTIONS}
    return values
