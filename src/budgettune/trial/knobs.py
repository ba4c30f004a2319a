"""What a knob is: one definition, declared as a field of `TrialSpec`, read by every room.

A knob is declared once, as ``name: Type = knob(default, ...)`` in `budgettune.trial.spec`:

- its **name** is the `TrialSpec` field, the ``SPEC.json`` and pin key, the ``[fix]`` key of a
  study file and ``--fix NAME=VALUE``, and ``budgettune trial --NAME`` (dashes for
  underscores); the list of values a search tries is its **plural**, the `SearchSpace` field,
  the ``[space]`` key and ``budgettune search --PLURAL`` (one spelling everywhere);
- its **values** come from the field's type (a ``Literal`` lists the choices; ``bool`` is
  false/true), and how the space samples them from ``sampled``;
- how the trial child and `pinned.compile` **apply** it is ``applied_by``: a knob with a
  ``functorch_key`` is patched into ``torch._functorch.config`` by
  `recompute.partitioner_settings`, which the child and the job both run around every compiled
  call; the other ways are the fixed paths of `recompute` (op list, compile, block AC), the
  optimizer and the allocator;
- how `show`, the dashboard and the pin **render** it is ``render``.

A new partitioner setting is one `knob(...)` line in `TrialSpec` and its tests:
``tests/unit/test_knobs.py`` fails for a knob the job does not apply or `show` does not render.
This module imports nothing of budgettune's but errors, so every room can read the registry.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, TypeVar

from budgettune.errors import SpecError, shown_value

T = TypeVar("T")

MAX_KNOB_INT = 2**32 - 1
"""The largest value of an integer knob or setting (a stride, a seed: torch seeds take 64
bits, the samplers 32); a pin's ``"seed": 10**400`` is refused here (issue 48)."""

AppliedBy = Literal[
    "partitioner",
    "op_list",
    "compile",
    "block_ac",
    "offload",
    "optimizer",
    "allocator",
    "batch",
    "step",
]
"""How the child and the job apply a knob: ``partitioner`` (its ``functorch_key``, scoped
around each compiled call), ``op_list`` (the partitioner's recomputable list), ``compile``
(`torch.compile`'s arguments), ``block_ac`` (checkpoint wrappers on the repeated blocks),
``offload`` (saved-tensor hooks around every k-th block, the blocks then compiled one by one:
`recompute.apply_offload`),
``optimizer`` (`pinned.optimizer`), ``allocator`` (`load_pinned`), ``batch`` (the builder's
``batch_size`` in the child; in the job the loader's batch and the accumulation, which
`PinnedConfig.batch_arguments` gives and the integrations check); ``step`` is no knob but a
setting of the measurement (steps, seed) that a job does not take from the pin."""
Sampled = Literal["choice", "range", "subset", "study"]
"""How the search varies a knob: ``choice`` (one of the values its plural lists), ``range``
(a float between ``PLURAL_low`` and ``PLURAL_high``, read ``[low, high]``), ``subset`` (each
candidate its plural lists in or out), ``study`` (one value for the whole study, not searched;
the step settings too)."""


def is_int(value: object) -> TypeGuard[int]:
    """An integer that is not a bool (``True`` is an int to Python, not a count or a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _always(spec: Any) -> bool:
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One knob: everything the rooms need to know of it (see the module docstring)."""

    name: str = ""
    """The `TrialSpec` field (filled in from the field by `knobs_of`)."""
    default: Any = None
    """The field's default: what runs when the knob is not set."""
    help: str
    """One line for ``--help``, the study-file schema and the docs."""
    value_type: type = object
    """``bool``, ``int``, ``float``, ``str`` or ``tuple`` (a tuple of op names)."""
    choices: tuple[Any, ...] = ()
    """The allowed values of a ``Literal`` or ``bool`` field (empty: any of its type)."""
    applied_by: AppliedBy
    """How the child and the job apply it."""
    functorch_key: str | None = None
    """The ``torch._functorch.config`` setting it is (``applied_by="partitioner"``)."""
    sampled: Sampled = "study"
    """How the search varies it."""
    plural: str = ""
    """Its list of values in a search: `SearchSpace` field, ``[space]`` key, search flag."""
    space_default: tuple[Any, ...] = ()
    """Values a new search tries (``range``: low, high; ``subset``: the candidates)."""
    space_default_cuda: tuple[Any, ...] | None = None
    """Values tried on CUDA, where they differ."""
    relevant: Callable[[Any], bool] = _always
    """Whether the knob matters for a spec (``TrialSpec``): sampled, blamed and shown only
    then. It reads only knobs declared above it (the search samples in declaration order)."""
    render: Callable[[Any], str | None] = lambda spec: None
    """Its part of `TrialSpec.describe` for a spec where it is relevant (None: nothing)."""
    study_wide: bool = False
    """One value per study (the compile backend): rendered in `TrialSpec.describe_study`,
    the study's title in `show` and the pin's table, not in each trial's line."""
    old_flag: str | None = None
    """The ``budgettune trial`` flag it had before issue 31, still accepted."""
    old_plural: str | None = None
    """The ``[space]`` key and ``budgettune search`` flag it had before issue 31, accepted."""

    @property
    def flag(self) -> str:
        """``--knapsack-solver``: the option of ``budgettune trial``."""
        return "--" + self.name.replace("_", "-")

    @property
    def plural_flag(self) -> str:
        """``--knapsack-solvers``: the option of ``budgettune search``."""
        return "--" + self.plural.replace("_", "-")

    @property
    def is_knob(self) -> bool:
        """False for the step settings (``warmup_steps``, ``timed_steps``, ``seed``)."""
        return self.applied_by != "step"

    def parse(self, text: str, *, what: str) -> Any:
        """A value of this knob from command-line text (``true``, ``2``, ``0.5``, ``fused``).

        Raises:
            SpecError: text that is not of the knob's type, naming ``what`` and the choices.
        """
        raw = text.strip()
        if self.value_type is bool:
            lowered = raw.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise SpecError(f"{what}: {text!r} is not true or false")
        if self.value_type in (int, float):
            try:
                integer = raw[1:] if raw.startswith("-") else raw
                if not raw.isascii() or (self.value_type is int and not integer.isdigit()):
                    raise ValueError(raw)  # Python's int() also reads "+2", "２" and "1_6"
                return self.value_type(raw)
            except ValueError:
                kind = "an integer" if self.value_type is int else "a number"
                raise SpecError(f"{what}: {text!r} is not {kind}") from None
        if self.value_type is tuple:
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return raw

    def check(self, value: Any) -> None:
        """Refuse a value of the wrong type, or not among the choices (one line naming both).

        Raises:
            SpecError: naming the knob and what it allows.
        """
        if self.choices:
            wrong_type = isinstance(value, bool) is not (self.value_type is bool)
            if wrong_type or value not in self.choices:
                if self.value_type is str:
                    allowed = ", ".join(self.choices)
                    raise SpecError(f"unknown {self.name} {value!r}; choose one of: {allowed}")
                allowed = " or ".join(_text(c) for c in self.choices)
                raise SpecError(f"{self.name} must be {allowed}, got {value!r}")
        elif self.value_type is int:
            if not is_int(value) or not 0 <= value <= MAX_KNOB_INT:
                raise SpecError(
                    f"{self.name} must be an integer from 0 to {MAX_KNOB_INT}, "
                    f"got {shown_value(value)}"
                )
        elif self.value_type is str and not isinstance(value, str):
            raise SpecError(f"{self.name} must be a string, got {value!r}")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) and not value else str(value)


def knob(default: T, **definition: Any) -> T:
    """Declare a `TrialSpec` field as a knob: ``name: Type = knob(default, help=..., ...)``.

    The keyword arguments are `Knob`'s fields but ``name``, ``value_type`` and ``choices``,
    which come from the field itself.
    """
    declared = Knob(default=default, **definition)
    return typing.cast(T, dataclasses.field(default=default, metadata={"knob": declared}))


def setting(default: T, *, help: str) -> T:
    """Declare a step setting of `TrialSpec` (no knob: how a trial measures, not what runs)."""
    return knob(default, help=help, applied_by="step")


def knobs_of(cls: type) -> tuple[Knob, ...]:
    """Every `knob(...)` field of a dataclass, in declaration order, with name, type and choices
    read off the field (``Literal[...]`` gives the choices, ``bool`` gives false and true)."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("knob")
        if not isinstance(declared, Knob):
            continue
        hint = hints[f.name]
        choices: tuple[Any, ...] = ()
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            value_type: type = type(choices[0])
        elif hint is bool:
            choices, value_type = (False, True), bool
        else:
            origin = typing.get_origin(hint)
            value_type = origin if isinstance(origin, type) else hint
        plural = declared.plural or (f.name + "s" if declared.sampled == "choice" else "")
        found.append(
            dataclasses.replace(
                declared, name=f.name, value_type=value_type, choices=choices, plural=plural
            )
        )
    return tuple(found)


def by_name(knobs: tuple[Knob, ...]) -> Mapping[str, Knob]:
    """The knobs by name."""
    return {k.name: k for k in knobs}
