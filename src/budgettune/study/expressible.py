"""A search kept to what a training stack's config can express (``--target torchtitan``,
issue 47): a torchtitan user whose pin had block AC and a budget together got exit 2 from
``export --format torchtitan`` and no way to ask the search for torchtitan's configurations.

With a target the space is narrowed to what its config holds (torchtitan v0.2.2's
``activation_checkpoint``, ``compile`` and ``optimizer`` sections, `integrations.torchtitan`):
no recomputable-op edits, torch's default knapsack solver and runtime estimator, the default
compile mode (or eager), no offload, each block compiled on its own as torchtitan compiles it.
What no list can say (block AC *or* a memory budget; the op policy only on every block) is
drawn as one choice of torchtitan's modes (`suggest_for_target`); the opening's points it
cannot express are not queued (`keeps`), and the pin is chosen among those it can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from budgettune.errors import UsageError, shown_value
from budgettune.integrations.torchtitan import inexpressible
from budgettune.study.space import SearchSpace, suggest_spec
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec

if TYPE_CHECKING:
    import optuna

TARGETS = ("torchtitan",)
"""The training stacks a search can be kept to."""
MODE_PARAM = "torchtitan_ac"
"""The Optuna param of torchtitan's activation-checkpoint mode."""
_TORCHTITAN_LISTS: dict[str, tuple[Any, ...]] = {
    "removable_ops": (),
    "addable_ops": (),
    "knapsack_solvers": ("dp",),
    "runtime_estimators": ("flops",),
    "offload_every": (0,),
    "compile_scopes": ("blocks",),
    "aggressive_recomputations": (False,),
}
"""The lists a torchtitan search tries (one value each: what its config holds)."""


def check_target(target: Any) -> None:
    """Refuse a target that is not one of `TARGETS` (or empty: none) in one line."""
    if target != "" and target not in TARGETS:
        raise UsageError(
            f"--target: unknown target {shown_value(target)}; choose {', '.join(TARGETS)} (or "
            "leave it out to search every configuration)"
        )


def narrowed_for(space: SearchSpace, target: str) -> SearchSpace:
    """``space`` with only what ``target``'s config can express (as it is with no target).

    Raises:
        UsageError: a ``--fix`` the target cannot express, in one line.
    """
    if not target:
        return space
    lists = dict(_TORCHTITAN_LISTS)
    lists["compile_modes"] = tuple(m for m in space.compile_modes if m in ("default", "eager"))
    lists["block_ac_policies"] = tuple(p for p in space.block_ac_policies if p in ("full", "op"))
    for plural in ("compile_modes", "block_ac_policies"):
        if not lists[plural]:
            raise UsageError(
                f"--target {target}: {plural} lists none torchtitan's config holds "
                f"({', '.join(map(str, getattr(space, plural)))})"
            )
    narrowed = space.replace(lists=lists)
    for name, value in space.fixed.items():
        knob = KNOB_BY_NAME.get(name)
        if knob is not None and knob.plural in lists and value not in lists[knob.plural]:
            raise UsageError(f"--target {target}: torchtitan's config cannot hold {name}={value}")
    if not _modes(narrowed):  # e.g. --fix block_ac_every=2 with a fixed budget below 1
        raise UsageError(
            f"--target {target}: the fixed block AC and budget are not one of torchtitan's "
            "activation-checkpoint modes (block AC or a memory budget, not both)"
        )
    return narrowed


def keeps(spec: TrialSpec, target: str) -> bool:
    """Whether ``target``'s config can express ``spec`` (always, with no target)."""
    return not target or inexpressible(spec) is None


def _modes(space: SearchSpace) -> dict[str, dict[str, Any]]:
    """torchtitan's activation-checkpoint modes the space allows, each as the knobs it fixes:
    none, a memory budget (no block AC), full AC on every k-th block, op AC on every block."""
    strides = space.values_of(KNOB_BY_NAME["block_ac_every"])
    policies = space.values_of(KNOB_BY_NAME["block_ac_policy"])
    budget = space.fixed.get("activation_memory_budget")
    modes: dict[str, dict[str, Any]] = {}
    if 0 in strides:
        if budget is not None:
            modes["none"] = {"block_ac_every": 0}  # at the fixed budget
        else:
            modes["none"] = {"block_ac_every": 0, "activation_memory_budget": 1.0}
            if space.budget_low < 1.0:
                modes["memory_budget"] = {"block_ac_every": 0}
    if budget is not None and budget < 1.0:
        return modes  # block AC with a budget below 1: not torchtitan's
    for every in (s for s in strides if s > 0):
        held = {"block_ac_every": every, "activation_memory_budget": 1.0}
        if "full" in policies:
            modes[f"full-{every}"] = {**held, "block_ac_policy": "full"}
        if "op" in policies and every == 1:
            modes["op-1"] = {**held, "block_ac_policy": "op"}
    return modes


def suggest_for_target(
    trial: optuna.trial.BaseTrial,
    space: SearchSpace,
    base: TrialSpec,
    declared: SearchSpace,
    target: str,
) -> TrialSpec:
    """`suggest_spec`, kept to what ``target`` expresses: torchtitan's activation-checkpoint
    mode drawn first (none, memory budget, full on every k-th block, op on every block), the
    knobs it fixes held, the rest drawn as usual."""
    if not target:
        return suggest_spec(trial, space, base, declared=declared)
    modes = _modes(space)  # never empty: `narrowed_for` refused such a space
    names = sorted(modes)
    mode = names[0] if len(names) == 1 else trial.suggest_categorical(MODE_PARAM, names)
    held = space.replace(fixed={**space.fixed, **modes[mode]})
    return suggest_spec(trial, held, base, declared=declared)
