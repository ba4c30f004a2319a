"""The search space, and the only caller of ``trial.suggest_*``: Optuna trial → `TrialSpec`.

Which knobs are searched, and over what, is a frozen `SearchSpace`; users narrow a dimension
(``--modes default``) or fix it (``--fix knapsack_solver=dp``). Facts built in (DESIGN.md §4):
the recomputable-op list matters at a budget near 1.0 and little below it, so op-list
parameters are only suggested there; OOMs are common, so nothing is pruned by a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError, UsageError
from budgettune.trial.allocator import parse_settings
from budgettune.trial.spec import (
    BLOCK_AC_POLICIES,
    COMPILE_MODES,
    EXPANDABLE,
    KNAPSACK_SOLVERS,
    OP_NAME_PATTERN,
    OPTIMIZER_IMPLS,
    RUNTIME_ESTIMATORS,
    TrialSpec,
)

if TYPE_CHECKING:
    import optuna

#: Cheap ops worth taking out of the recomputable list (the "nosac" trick removes aten.add).
DEFAULT_REMOVABLE_OPS = (
    "aten.add",
    "aten.mul",
    "aten.sum",
    "aten.mean",
    "aten._to_copy",
    "prims.convert_element_type",
    "aten.silu",
    "aten.rsqrt",
    "aten.pow",
)
#: Compute-intensive ops worth putting into it (at budget 1.0 on a CPU tiny GPT, adding
#: mm/addmm/attention cut the peak 149 → 92 MB).
DEFAULT_ADDABLE_OPS_CUDA = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
)
DEFAULT_ADDABLE_OPS_CPU = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten._scaled_dot_product_flash_attention_for_cpu",
)
#: Op-list parameters are suggested only at budgets at or above this.
OP_LIST_MIN_BUDGET = 0.9
#: Dimension names usable with ``--fix NAME=VALUE`` (the TrialSpec field names).
FIXABLE = (
    "activation_memory_budget",
    "knapsack_solver",
    "runtime_estimator",
    "compile_mode",
    "compile_backend",
    "block_ac_every",
    "block_ac_policy",
    "optimizer_impl",
    "cuda_alloc_conf",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """What the tuner may vary, and what it must keep fixed."""

    budget_low: float = 0.0
    """Lowest activation_memory_budget suggested."""
    budget_high: float = 1.0
    """Highest activation_memory_budget suggested."""
    removable_ops: tuple[str, ...] = DEFAULT_REMOVABLE_OPS
    """Candidates for ``recompute_ops_removed`` (each a yes/no parameter, near budget 1.0)."""
    addable_ops: tuple[str, ...] = DEFAULT_ADDABLE_OPS_CPU
    """Candidates for ``recompute_ops_added`` (each a yes/no parameter, near budget 1.0)."""
    knapsack_solvers: tuple[str, ...] = ("dp", "greedy")
    """Solvers tried (ilp needs scipy in the trial's environment)."""
    runtime_estimators: tuple[str, ...] = ("flops",)
    """Estimators tried (profile needs CUDA and crashed a process on an H200)."""
    compile_modes: tuple[str, ...] = ("default",)
    """Compile modes tried (``eager`` is always measured as a baseline-like point if listed)."""
    compile_backend: str = "inductor"
    """The compile backend (not searched)."""
    block_ac_every: tuple[int, ...] = (0, 1, 2, 4)
    """Block-AC strides tried (0 = off)."""
    block_ac_policies: tuple[str, ...] = ("full", "op")
    """Block-AC policies tried when block AC is on."""
    optimizer_impls: tuple[str, ...] = ("as_written", "fused")
    """Optimizer implementations tried."""
    cuda_alloc_confs: tuple[str, ...] = ("",)
    """PYTORCH_CUDA_ALLOC_CONF values tried."""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Dimensions held at one value (``--fix``): never suggested."""

    def __post_init__(self) -> None:
        budgets = (self.budget_low, self.budget_high)
        if any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in budgets):
            raise SpecError(f"the budget range must be two numbers, got {list(budgets)}")
        if not 0.0 <= self.budget_low <= self.budget_high <= 1.0:
            raise SpecError(
                f"budget range must satisfy 0 <= low <= high <= 1, got "
                f"[{self.budget_low}, {self.budget_high}]"
            )
        for name, values, allowed in (
            ("knapsack_solvers", self.knapsack_solvers, KNAPSACK_SOLVERS),
            ("runtime_estimators", self.runtime_estimators, RUNTIME_ESTIMATORS),
            ("compile_modes", self.compile_modes, COMPILE_MODES),
            ("block_ac_policies", self.block_ac_policies, BLOCK_AC_POLICIES),
            ("optimizer_impls", self.optimizer_impls, OPTIMIZER_IMPLS),
        ):
            if not values:
                raise SpecError(f"{name} must list at least one value")
            for value in values:
                if value not in allowed:
                    raise SpecError(
                        f"{name}: unknown value {value!r}; choose from {', '.join(allowed)}"
                    )
        strides = self.block_ac_every
        if not strides or any(isinstance(k, bool) or not isinstance(k, int) for k in strides):
            raise SpecError(f"block_ac_every must list integer strides, got {list(strides)}")
        if any(k < 0 for k in strides):
            raise SpecError(f"block_ac_every must list non-negative strides, got {list(strides)}")
        if not self.cuda_alloc_confs:
            raise SpecError("cuda_alloc_confs must list at least one value ('' = default)")
        for name, texts in (
            ("cuda_alloc_confs", self.cuda_alloc_confs),
            ("removable_ops", self.removable_ops),
            ("addable_ops", self.addable_ops),
        ):
            if any(not isinstance(t, str) for t in texts):
                raise SpecError(f"{name} must list strings, got {list(texts)}")
        for conf in self.cuda_alloc_confs:
            parse_settings(conf)  # torch aborts the trial on a malformed one
        for op in (*self.removable_ops, *self.addable_ops):
            if not OP_NAME_PATTERN.match(op):
                raise SpecError(f"{op!r} is not an op name; write it like aten.add or aten.mm")
        unknown = sorted(set(self.fixed) - set(FIXABLE))
        if unknown:
            raise UsageError(
                f"--fix: unknown dimension(s) {', '.join(unknown)}; fixable: {', '.join(FIXABLE)}"
            )
        # Validate the fixed values through TrialSpec itself.
        TrialSpec(**{k: v for k, v in self.fixed.items() if k in TrialSpec.__slots__})
        object.__setattr__(self, "fixed", dict(self.fixed))

    @classmethod
    def for_device(cls, device: str, **changes: Any) -> SearchSpace:
        """Defaults that favour what is worth its compile time on ``device``."""
        if device.startswith("cuda"):
            base = dict(
                addable_ops=DEFAULT_ADDABLE_OPS_CUDA,
                compile_modes=("default",),
                cuda_alloc_confs=("", EXPANDABLE),
            )
        else:
            base = dict(addable_ops=DEFAULT_ADDABLE_OPS_CPU, cuda_alloc_confs=("",))
        base.update(changes)
        return cls(**base)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> SearchSpace:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (lists for tuples)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = list(value) if isinstance(value, tuple) else value
        data["fixed"] = dict(self.fixed)
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """Build from the JSON form; unknown keys are an error, missing keys take defaults.

        Raises:
            SpecError: on an unknown key or an invalid value.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise SpecError(f"unknown SearchSpace key(s): {', '.join(unknown)}")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**values)


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
        value: Any = raw.strip()
        if name == "activation_memory_budget":
            try:
                value = float(raw)
            except ValueError:
                raise UsageError(f"--fix {pair!r}: the budget must be a number") from None
        elif name == "block_ac_every":
            try:
                value = int(raw)
            except ValueError:
                raise UsageError(f"--fix {pair!r}: the stride must be an integer") from None
        fixed[name] = value
    return fixed


def _choose(trial: optuna.trial.BaseTrial, name: str, space: SearchSpace, values: tuple) -> Any:
    if name in space.fixed:
        return space.fixed[name]
    if len(values) == 1:
        return values[0]
    return trial.suggest_categorical(name, list(values))


def suggest_spec(trial: optuna.trial.BaseTrial, space: SearchSpace, base: TrialSpec) -> TrialSpec:
    """Draw one configuration from ``space``; fields not searched come from ``base``.

    Args:
        trial: the Optuna trial (its params are the knobs, under their TrialSpec names; op-list
            parameters are named ``remove:aten.add`` / ``add:aten.mm``).
        space: the search space.
        base: seed, step counts and anything else the search does not vary.

    Returns:
        A validated `TrialSpec`.
    """
    mode = _choose(trial, "compile_mode", space, space.compile_modes)
    block_ac_every = _choose(trial, "block_ac_every", space, space.block_ac_every)
    policy = (
        _choose(trial, "block_ac_policy", space, space.block_ac_policies)
        if block_ac_every > 0
        else "full"
    )
    changes: dict[str, Any] = dict(
        compile_mode=mode,
        compile_backend=space.fixed.get("compile_backend", space.compile_backend),
        block_ac_every=block_ac_every,
        block_ac_policy=policy,
        optimizer_impl=_choose(trial, "optimizer_impl", space, space.optimizer_impls),
        cuda_alloc_conf=_choose(trial, "cuda_alloc_conf", space, space.cuda_alloc_confs),
    )
    if mode != "eager":
        if "activation_memory_budget" in space.fixed:
            budget = float(space.fixed["activation_memory_budget"])
        elif space.budget_low == space.budget_high:
            budget = space.budget_low
        else:
            budget = trial.suggest_float(
                "activation_memory_budget", space.budget_low, space.budget_high
            )
        changes["activation_memory_budget"] = budget
        if budget < 1.0:
            changes["knapsack_solver"] = _choose(
                trial, "knapsack_solver", space, space.knapsack_solvers
            )
            changes["runtime_estimator"] = _choose(
                trial, "runtime_estimator", space, space.runtime_estimators
            )
        if budget >= OP_LIST_MIN_BUDGET:
            changes["recompute_ops_removed"] = tuple(
                op
                for op in space.removable_ops
                if trial.suggest_categorical(f"remove:{op}", [False, True])
            )
            changes["recompute_ops_added"] = tuple(
                op
                for op in space.addable_ops
                if trial.suggest_categorical(f"add:{op}", [False, True])
            )
    return base.replace(**changes)


def spec_params(spec: TrialSpec, space: SearchSpace) -> dict[str, Any]:
    """The Optuna params that make `suggest_spec` return ``spec`` (for ``enqueue_trial``).

    Params of dimensions that are fixed or have one value are left out, as `suggest_spec`
    does not suggest them.
    """
    params: dict[str, Any] = {}
    for name, values in (
        ("compile_mode", space.compile_modes),
        ("block_ac_every", space.block_ac_every),
        ("block_ac_policy", space.block_ac_policies),
        ("optimizer_impl", space.optimizer_impls),
        ("cuda_alloc_conf", space.cuda_alloc_confs),
        ("knapsack_solver", space.knapsack_solvers),
        ("runtime_estimator", space.runtime_estimators),
    ):
        if name not in space.fixed and len(values) > 1:
            params[name] = getattr(spec, name)
    if "activation_memory_budget" not in space.fixed and space.budget_low < space.budget_high:
        params["activation_memory_budget"] = spec.activation_memory_budget
    for op in space.removable_ops:
        params[f"remove:{op}"] = op in spec.recompute_ops_removed
    for op in space.addable_ops:
        params[f"add:{op}"] = op in spec.recompute_ops_added
    return params
