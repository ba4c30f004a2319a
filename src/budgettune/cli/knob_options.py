"""Command-line options made from the knobs' definitions (`budgettune.trial.knobs`).

``budgettune trial`` takes one value of each knob (``--knapsack-solver greedy``), and
``budgettune search`` the list of values to try (``--knapsack-solvers dp,greedy``): the
option names are the knob's name and plural with dashes, its help is the knob's, and the
spelling before issue 31 (``--solver``, ``--solvers``) is still accepted. A command declares a
``knobs: dict`` parameter; `with_options` replaces it with the options and hands the given
values (None: not given) to the command in that dict (`cli.study_options` uses it too).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from budgettune.errors import SpecError, UsageError
from budgettune.study.batch import powers_of_two
from budgettune.trial.allocator import split_settings
from budgettune.trial.knobs import Knob
from budgettune.trial.spec import KNOBS

F = TypeVar("F", bound=Callable[..., Any])
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _default_text(k: Knob) -> str:
    value = k.default
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value in ("", ()) else str(value)


def trial_parameters() -> list[inspect.Parameter]:
    """One option per `TrialSpec` field, for ``budgettune trial``."""
    params = []
    for k in KNOBS:
        names = [k.flag] + ([k.old_flag] if k.old_flag else [])
        choices = (
            f" ({', '.join(map(str, k.choices))})" if k.choices and k.value_type is str else ""
        )
        text = f"{k.help}{choices}; default {_default_text(k)}."
        kind: Any
        if k.value_type is bool:
            names = [f"{k.flag}/--no-{k.flag[2:]}"]
            kind = bool | None
        elif k.value_type is tuple:
            text = f"{k.help} (repeatable); default none."
            kind = list[str] | None
        else:
            kind = k.value_type | None
        option = typer.Option(*names, help=text, show_default=False)
        params.append(
            inspect.Parameter(k.name, _KEYWORD, default=None, annotation=Annotated[kind, option])
        )
    return params


def search_parameters() -> list[inspect.Parameter]:
    """One option per searched knob's list of values (its plural), for ``budgettune search``."""
    params = []
    for k in KNOBS:
        if not k.is_knob or not k.plural:
            continue
        names = [k.plural_flag]
        if k.old_plural:  # a range's old flag was --NAME-range (--budget-range)
            old = k.old_plural + ("_range" if k.sampled == "range" else "")
            names.append("--" + old.replace("_", "-"))
        if k.sampled == "range":
            text = f"{k.help}: the range searched, LOW,HIGH (default 0,1)."
        elif k.study_wide:
            text = f"{k.help} (one per study)."
        else:
            extra = {
                "cuda_alloc_conf": "; 'default' for unset",
                "micro_batch": ", or a range of powers of two, 1..32",
            }.get(k.name, "")
            text = f"{k.help}: the values searched, comma-separated{extra}."
        option = typer.Option(*names, help=text, show_default=False)
        params.append(
            inspect.Parameter(
                k.plural, _KEYWORD, default=None, annotation=Annotated[str | None, option]
            )
        )
    return params


def with_options(
    parameters: Callable[[], list[inspect.Parameter]], into: str = "knobs", *, first: bool = False
) -> Callable[[F], F]:
    """Give a Typer command the options ``parameters`` makes, in place of its parameter named
    ``into`` (a dict), which receives their values by name (None where not given); ``first``:
    before the command's own (in ``--help``). Applied twice, each fills its own dict."""

    def wrap(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != into]
        extra = parameters()
        names = [p.name for p in extra]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            return command(**kwargs, **{into: given})

        # typer calls by keyword: every option keyword-only lets either come first
        own = [p.replace(kind=_KEYWORD) for p in own]
        ordered = [*extra, *own] if first else [*own, *extra]
        wrapper.__signature__ = signature.replace(parameters=ordered)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {}
        return wrapper  # type: ignore[return-value]

    return wrap


def spec_values(given: dict[str, Any]) -> dict[str, Any]:
    """The `TrialSpec` values given on ``budgettune trial`` (tuples for the op lists)."""
    return {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in given.items()
        if value is not None
    }


def space_values(given: dict[str, Any]) -> dict[str, Any]:
    """The ``[space]`` values given on ``budgettune search``: each plural's list, parsed by its
    knob (``default`` in an allocator list is the unset ``''``).

    Raises:
        UsageError: a value that is not of the knob's type, naming the option.
    """
    by_plural = {k.plural: k for k in KNOBS if k.is_knob and k.plural}
    values: dict[str, Any] = {}
    for plural, text in given.items():
        if text is None:
            continue
        k = by_plural[plural]
        if k.study_wide:
            values[plural] = text
            continue
        parts = [part.strip() for part in text.split(",") if part.strip()]
        what = k.plural_flag
        try:
            if k.name == "micro_batch" and ".." in text:
                values[plural] = powers_of_two(text)  # 1..32: 1, 2, 4, ..., 32
            elif k.sampled == "range":
                values[plural] = [float(p) for p in parts]
                if len(parts) != 2:
                    raise UsageError(f"{what} takes LOW,HIGH, e.g. 0.3,1.0")
            elif k.sampled == "subset":
                values[plural] = parts
            elif k.name == "cuda_alloc_conf":  # a bracketed value's commas are its own
                values[plural] = ["" if p == "default" else p for p in split_settings(text)]
            else:
                values[plural] = [k.parse(p, what=what) for p in parts]
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        except ValueError:
            raise UsageError(
                f"{what}: {text!r} is not a comma-separated list of numbers"
            ) from None
    return values
