"""The search space, and the only caller of ``trial.suggest_*``: Optuna trial → `TrialSpec`.

Which knobs are searched, and over what, is a frozen `SearchSpace`; users narrow a dimension
(``--modes default``) or fix it (``--fix knapsack_solver=dp``). Facts built in:
the recomputable-op list matters at a budget near 1.0 and little below it, so op-list
parameters are only suggested there; OOMs are common, so nothing is pruned by a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError, UsageError
from budgettune.study.batch import powers_of_two
from budgettune.trial.knobs import Knob
from budgettune.trial.op_lists import (
    DEFAULT_ADDABLE_OPS_CPU,  # noqa: F401 - re-exported
    DEFAULT_ADDABLE_OPS_CUDA,  # noqa: F401 - re-exported
    DEFAULT_REMOVABLE_OPS,  # noqa: F401 - re-exported
    OP_NAME_PATTERN,
)
from budgettune.trial.spec import KNOB_BY_NAME, KNOBS, TrialSpec

if TYPE_CHECKING:
    import optuna

#: Op-list parameters are suggested only at budgets at or above this.
OP_LIST_MIN_BUDGET = 0.9
SEARCHED = tuple(k for k in KNOBS if k.is_knob and k.sampled != "study")
"""The knobs a search varies, in the order it samples them (`TrialSpec`'s)."""
LISTED = tuple(k for k in SEARCHED if k.sampled in ("choice", "subset"))
"""The knobs whose values a `SearchSpace` lists, under their plural."""
_LISTED_BY_PLURAL = {k.plural: k for k in LISTED}
FIXABLE = tuple(k.name for k in KNOBS if k.is_knob and k.sampled != "subset")
"""Dimension names usable with ``--fix NAME=VALUE`` (the TrialSpec field names)."""
_SUBSET_PARAM = {"recompute_ops_removed": "remove", "recompute_ops_added": "add"}
"""The Optuna param prefix of each candidate of a subset knob (``remove:aten.add``)."""


def _once(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` without repeats, in order (an unhashable value, refused by `_check`, kept)."""
    try:
        return tuple(dict.fromkeys(values))
    except TypeError:
        return values


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class SearchSpace:
    """What the tuner may vary, and what it must keep fixed.

    Built as ``SearchSpace(knapsack_solvers=("dp",), block_ac_every=(0, 1))``: each listed
    knob's values under its plural (`Knob.plural`), read back as ``space.knapsack_solvers``;
    a knob not given tries its `Knob.space_default`.
    """

    budget_low: float
    """Lowest activation_memory_budget suggested."""
    budget_high: float
    """Highest activation_memory_budget suggested."""
    compile_backend: str
    """The compile backend (not searched: one per study)."""
    lists: Mapping[str, tuple[Any, ...]]
    """The values tried of each listed knob (`LISTED`), by plural (op lists: candidates)."""
    fixed: Mapping[str, Any]
    """Dimensions held at one value (``--fix``): never suggested."""

    def __init__(
        self,
        *,
        budget_low: float = 0.0,
        budget_high: float = 1.0,
        compile_backend: str = "inductor",
        fixed: Mapping[str, Any] | None = None,
        lists: Mapping[str, Any] | None = None,
        **values: Any,
    ) -> None:
        unknown = sorted(set(values) - set(_LISTED_BY_PLURAL))
        if unknown:
            raise SpecError(
                f"unknown SearchSpace field(s) {', '.join(unknown)}; known: "
                + ", ".join(["budget_low", "budget_high", "compile_backend", "fixed"])
                + ", "
                + ", ".join(_LISTED_BY_PLURAL)
            )
        given = {**(lists or {}), **values}
        if isinstance(given.get("micro_batches"), str):  # a range of powers of two: "1..32"
            try:
                given["micro_batches"] = powers_of_two(given["micro_batches"])
            except UsageError as exc:
                raise SpecError(str(exc)) from None
        # each value once, in the order given (a repeat was a second Optuna choice, and a
        # baseline's value outside the list then a traceback: issue 48)
        merged = {k.plural: _once(tuple(given.get(k.plural, k.space_default))) for k in LISTED}
        object.__setattr__(self, "budget_low", budget_low)
        object.__setattr__(self, "budget_high", budget_high)
        object.__setattr__(self, "compile_backend", compile_backend)
        object.__setattr__(self, "lists", merged)
        object.__setattr__(self, "fixed", dict(fixed or {}))
        self._check()

    def __getattr__(self, name: str) -> tuple[Any, ...]:
        if name in _LISTED_BY_PLURAL:
            return self.lists[name]
        raise AttributeError(f"SearchSpace has no {name!r}")

    def values_of(self, knob: Knob) -> tuple[Any, ...]:
        """The values tried of a listed knob (its fixed value, when fixed)."""
        if knob.name in self.fixed:
            return (self.fixed[knob.name],)
        return self.lists[knob.plural]

    def _check(self) -> None:
        budgets = (self.budget_low, self.budget_high)
        if any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in budgets):
            raise SpecError(f"the budget range must be two numbers, got {list(budgets)}")
        if not 0.0 <= self.budget_low <= self.budget_high <= 1.0:
            raise SpecError(
                f"activation_memory_budget_range (the budget range) must satisfy "
                f"0 <= low <= high <= 1, got "
                f"[{self.budget_low}, {self.budget_high}]"
            )
        KNOB_BY_NAME["compile_backend"].check(self.compile_backend)
        for k in LISTED:
            values = self.lists[k.plural]
            if k.sampled == "subset":
                if any(not isinstance(op, str) for op in values):
                    raise SpecError(f"{k.plural} must list strings, got {list(values)}")
                for op in values:
                    if not OP_NAME_PATTERN.fullmatch(op):
                        raise SpecError(
                            f"{op!r} is not an op name; write it like aten.add or aten.mm"
                        )
                continue
            if not values:
                raise SpecError(f"{k.plural} must list at least one value")
            if k.value_type is int and not k.choices:
                what = "sizes" if k.name == "micro_batch" else "strides"
                if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                    raise SpecError(f"{k.plural} must list integer {what}, got {list(values)}")
                if any(v < 0 for v in values):
                    raise SpecError(
                        f"{k.plural} must list non-negative {what}, got {list(values)}"
                    )
            for value in values:
                if k.choices and (
                    value not in k.choices or isinstance(value, bool) is not (k.value_type is bool)
                ):
                    allowed = ", ".join(str(c) for c in k.choices)
                    raise SpecError(f"{k.plural}: unknown value {value!r}; choose from {allowed}")
                try:
                    k.check(value)
                    TrialSpec(**{k.name: value})
                except SpecError as exc:
                    raise SpecError(f"{k.plural}: {exc}") from None
        unknown = sorted(set(self.fixed) - set(FIXABLE))
        if unknown:
            raise UsageError(
                f"--fix: unknown dimension(s) {', '.join(unknown)}; fixable: {', '.join(FIXABLE)}"
            )
        # Validate the fixed values through TrialSpec itself.
        TrialSpec(**dict(self.fixed))

    @classmethod
    def for_device(cls, device: str, **changes: Any) -> SearchSpace:
        """Defaults that favour what is worth its compile time on ``device`` (a knob's
        `Knob.space_default_cuda` on CUDA)."""
        base: dict[str, Any] = {}
        if device.startswith("cuda"):
            base = {k.plural: k.space_default_cuda for k in LISTED if k.space_default_cuda}
        base.update(changes)
        return cls(**base)

    def replace(self, **changes: Any) -> SearchSpace:
        """A copy with some fields changed (validated again)."""
        current: dict[str, Any] = {
            "budget_low": self.budget_low,
            "budget_high": self.budget_high,
            "compile_backend": self.compile_backend,
            "fixed": self.fixed,
            **self.lists,
        }
        lists = changes.pop("lists", {})
        return SearchSpace(**{**current, **lists, **changes})

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (lists for tuples; each listed knob under its plural)."""
        data: dict[str, Any] = {"budget_low": self.budget_low, "budget_high": self.budget_high}
        data.update({plural: list(values) for plural, values in self.lists.items()})
        data["compile_backend"] = self.compile_backend
        data["fixed"] = dict(self.fixed)
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """Build from the JSON form; unknown keys are an error. A knob missing from a space
        stored before it existed tries only its default, as that study did.

        Raises:
            SpecError: on an unknown key or an invalid value.
        """
        known = {"budget_low", "budget_high", "compile_backend", "fixed", *_LISTED_BY_PLURAL}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown SearchSpace key(s): {', '.join(unknown)}")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        for k in LISTED:
            if k.plural not in values and k.name not in _STORED_SINCE_THE_START:
                values[k.plural] = () if k.sampled == "subset" else (k.default,)
        return cls(**values)


_STORED_SINCE_THE_START = (
    "compile_mode",
    "knapsack_solver",
    "runtime_estimator",
    "recompute_ops_removed",
    "recompute_ops_added",
    "block_ac_every",
    "block_ac_policy",
    "optimizer_impl",
    "cuda_alloc_conf",
)
"""Knobs every stored space lists (a stored space without one takes today's default, as
before); a knob added later is searched in an old study only if asked for."""


def parse_fixed(pairs: list[str]) -> dict[str, Any]:
    """``["knapsack_solver=dp", "block_ac_every=0"]`` → typed values for `SearchSpace.fixed`.

    Raises:
        UsageError: a pair that is not NAME=VALUE, or an unknown NAME.
    """
    fixed: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--fix {pair!r}: write it as NAME=VALUE, e.g. knapsack_solver=dp")
        if name not in FIXABLE:
            raise UsageError(f"--fix: unknown dimension {name!r}; fixable: {', '.join(FIXABLE)}")
        fixed[name] = KNOB_BY_NAME[name].parse(raw, what=f"--fix {pair!r}")
    return fixed


def _choose(
    trial: optuna.trial.BaseTrial, name: str, space: SearchSpace, values: tuple, declared: tuple
) -> Any:
    if name in space.fixed:
        return space.fixed[name]
    if len(values) == 1:
        return values[0]
    return trial.suggest_categorical(choice_param(name, values, declared), list(values))


def choice_param(name: str, values: tuple, declared: tuple) -> str:
    """The Optuna param of a choice knob drawn from ``values``.

    Optuna refuses a categorical param whose choices change within a study ("does not
    support dynamic value space"), so a list narrowed after the study began (values that
    crashed excluded, `crash_memory.narrow`) is drawn under a name of its own:
    ``block_ac_policy[full|op]``. The declared list keeps the knob's own name.
    """
    if tuple(values) == tuple(declared):
        return name
    return f"{name}[{'|'.join(str(v) for v in values)}]"


def suggest_spec(
    trial: optuna.trial.BaseTrial,
    space: SearchSpace,
    base: TrialSpec,
    *,
    declared: SearchSpace | None = None,
) -> TrialSpec:
    """Draw one configuration from ``space``; fields not searched come from ``base``.

    Each searched knob is drawn in `TrialSpec`'s order where it is relevant (`Knob.relevant`
    of what is drawn so far), and left at its default where it is not.

    Args:
        trial: the Optuna trial (its params are the knobs, under their TrialSpec names; op-list
            parameters are named ``remove:aten.add`` / ``add:aten.mm``).
        space: the search space.
        base: seed, step counts and anything else the search does not vary.
        declared: the search's space as declared, when ``space`` is it narrowed (a choice list
            narrowed since is drawn under a param of its own: `choice_param`).

    Returns:
        A validated `TrialSpec`.
    """
    declared = declared or space
    spec = base.replace(compile_backend=space.fixed.get("compile_backend", space.compile_backend))
    for k in SEARCHED:
        if not k.relevant(spec):
            value = k.default
        elif k.sampled == "range":
            value = _draw_budget(trial, space)
        elif k.sampled == "subset":
            if not (spec.is_compiled and spec.activation_memory_budget >= OP_LIST_MIN_BUDGET):
                continue
            prefix = _SUBSET_PARAM.get(k.name, k.plural)
            value = tuple(
                op
                for op in space.lists[k.plural]
                if trial.suggest_categorical(f"{prefix}:{op}", [False, True])
            )
        else:
            value = _choose(trial, k.name, space, space.lists[k.plural], declared.lists[k.plural])
        spec = spec.replace(**{k.name: value})
    return spec


def _draw_budget(trial: optuna.trial.BaseTrial, space: SearchSpace) -> float:
    if "activation_memory_budget" in space.fixed:
        return float(space.fixed["activation_memory_budget"])
    if space.budget_low == space.budget_high:
        return space.budget_low
    return trial.suggest_float("activation_memory_budget", space.budget_low, space.budget_high)


def spec_params(spec: TrialSpec, space: SearchSpace) -> dict[str, Any]:
    """The Optuna params that make `suggest_spec` return ``spec`` (for ``enqueue_trial``).

    Params of dimensions that are fixed or have one value are left out, as `suggest_spec`
    does not suggest them, and so is a value the space does not list.
    """
    params: dict[str, Any] = {}
    for k in LISTED:
        values = space.lists[k.plural]
        if k.sampled == "subset":
            prefix = _SUBSET_PARAM.get(k.name, k.plural)
            for op in values:
                params[f"{prefix}:{op}"] = op in getattr(spec, k.name)
        elif k.name not in space.fixed and len(values) > 1 and getattr(spec, k.name) in values:
            # a baseline's value the list leaves out (AdamW as written beside
            # --optimizer-impls foreach,fused) is no param: Optuna refuses a choice outside
            # the list (a traceback, issue 48); the trial runs the enqueued spec all the same
            params[k.name] = getattr(spec, k.name)
    if "activation_memory_budget" not in space.fixed and space.budget_low < space.budget_high:
        params["activation_memory_budget"] = spec.activation_memory_budget
    return params
