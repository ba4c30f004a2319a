"""`TrialSpec`: one configuration of the recompute knobs (`trial_run.TrialRun` is one trial to
launch).

It is a frozen, validated dataclass; its field names are the JSON keys of ``SPEC.json``'s
``spec`` (the parent/child contract). Op *names* are checked for syntax here; whether
an op exists is checked by `recompute.py` in the child, which is the only place torch is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from budgettune.errors import SpecError, shown_value
from budgettune.trial.allocator import parse_settings
from budgettune.trial.knobs import Knob, by_name, is_int, knob, knobs_of, setting
from budgettune.trial.op_lists import (
    DEFAULT_ADDABLE_OPS_CPU,
    DEFAULT_ADDABLE_OPS_CUDA,
    DEFAULT_REMOVABLE_OPS,
    OP_NAME_PATTERN,  # noqa: F401 - re-exported
    check_op_names,
)
from budgettune.trial.relevance import (
    CUDA_GRAPH_MODES,
    below_one,
    blocks_compile,
    compiled,
    offload_relevant,
)

EXPANDABLE = "expandable_segments:True"
"""The ``cuda_alloc_conf`` that ends the caching allocator's fragmentation (CUDA)."""

MAX_STEPS = 10_000
"""Bound of a trial's warm-up and timed steps (10^12 ran until killed: issue 48)."""


def _ops(sign: str, ops: tuple[str, ...]) -> str | None:
    return sign + ",".join(op.split(".", 1)[1] for op in ops) if ops else None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSpec:
    """One configuration of every recompute knob budgettune searches.

    Each field is a knob, declared once (`budgettune.trial.knobs`): a knob's relevance reads
    only the knobs above it, and `describe` renders them in this order.
    """

    compile_mode: Literal[
        "eager", "default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune"
    ] = knob(
        "default",
        help="torch.compile mode, or eager for no compile at all",
        applied_by="compile",
        sampled="choice",
        space_default=("default",),
        old_flag="--mode",
        old_plural="modes",
        render=lambda s: s.compile_mode if s.compile_mode != "default" else None,
    )
    compile_backend: Literal["inductor", "aot_eager_decomp_partition"] = knob(
        "inductor",
        help="inductor, or aot_eager_decomp_partition (same partitioner, no codegen)",
        applied_by="compile",
        plural="compile_backend",
        relevant=compiled,
        study_wide=True,
        old_flag="--backend",
        old_plural="backend",
        render=lambda s: (
            f"backend {s.compile_backend}" if s.compile_backend != "inductor" else None
        ),
    )
    activation_memory_budget: float = knob(
        1.0,
        help="torch._functorch.config.activation_memory_budget: 0 (recompute all) .. 1",
        applied_by="partitioner",
        functorch_key="activation_memory_budget",
        sampled="range",
        plural="activation_memory_budget_range",
        space_default=(0.0, 1.0),
        relevant=compiled,
        old_flag="--budget",
        old_plural="budget",
        render=lambda s: f"budget {s.activation_memory_budget:.2f}",
    )
    knapsack_solver: Literal["dp", "greedy", "ilp"] = knob(
        "dp",
        help="activation_memory_budget_solver (ilp needs scipy)",
        applied_by="partitioner",
        functorch_key="activation_memory_budget_solver",
        sampled="choice",
        space_default=("dp", "greedy"),
        relevant=below_one,
        old_flag="--solver",
        old_plural="solvers",
        render=lambda s: f"solver {s.knapsack_solver}" if s.knapsack_solver != "dp" else None,
    )
    runtime_estimator: Literal["flops", "profile"] = knob(
        "flops",
        help="activation_memory_budget_runtime_estimator (profile needs CUDA)",
        applied_by="partitioner",
        functorch_key="activation_memory_budget_runtime_estimator",
        sampled="choice",
        space_default=("flops",),
        relevant=below_one,
        old_flag="--estimator",
        old_plural="estimators",
        render=lambda s: (
            f"estimator {s.runtime_estimator}" if s.runtime_estimator != "flops" else None
        ),
    )
    recompute_ops_removed: tuple[str, ...] = knob(
        (),
        help="aten/prims ops taken out of the partitioner's recomputable list (aten.add)",
        applied_by="op_list",
        sampled="subset",
        plural="removable_ops",
        space_default=DEFAULT_REMOVABLE_OPS,
        old_flag="--remove-op",
        old_plural="remove_ops",
        render=lambda s: _ops("-", s.recompute_ops_removed),
    )
    recompute_ops_added: tuple[str, ...] = knob(
        (),
        help="aten ops put into the partitioner's recomputable list (aten.mm)",
        applied_by="op_list",
        sampled="subset",
        plural="addable_ops",
        space_default=DEFAULT_ADDABLE_OPS_CPU,
        space_default_cuda=DEFAULT_ADDABLE_OPS_CUDA,
        old_flag="--add-op",
        old_plural="add_ops",
        render=lambda s: _ops("+", s.recompute_ops_added),
    )
    block_ac_every: int = knob(
        0,
        help="0 = off; k = non-reentrant torch.utils.checkpoint on every k-th repeated block",
        applied_by="block_ac",
        sampled="choice",
        plural="block_ac_every",
        space_default=(0, 1, 2, 4),
        old_flag="--ac-every",
        old_plural="ac_every",
        render=lambda s: (
            f"AC every {s.block_ac_every} ({s.block_ac_policy})" if s.block_ac_every else None
        ),
    )
    block_ac_policy: Literal["full", "op", "op_offload"] = knob(
        "full",
        help="full recomputes the whole block; op is torchtitan's selective op policy; "
        "op_offload moves what op saves to host memory (the partitioner's activation "
        "offloading, compiled only; found by feature: torch 2.11 and 2.13 have it)",
        applied_by="block_ac",
        sampled="choice",
        plural="block_ac_policies",
        space_default=("full", "op"),
        relevant=lambda s: s.block_ac_every > 0,
        old_flag="--ac-policy",
        old_plural="ac_policies",
        render=lambda s: None,  # in block_ac_every's "AC every 2 (op)"
    )
    offload_every: int = knob(
        0,
        help="0 = off; k = every k-th repeated block's saved activations go to host memory in "
        "the forward and come back for the backward (side stream, pinned memory; compiled, "
        "each block is compiled on its own with the hooks around it; not with CUDA graphs; "
        "any torch)",
        applied_by="offload",
        sampled="choice",
        plural="offload_every",
        space_default=(0,),  # searched when a study lists strides: --offload-every 0,1,2
        relevant=lambda s: offload_relevant(s),
        render=lambda s: f"offload every {s.offload_every}" if s.offload_every else None,
    )
    compile_scope: Literal["model", "blocks"] = knob(
        "model",
        help="model: one compile of the whole model; blocks: each repeated block compiled "
        "(once, reused by its copies: regional compilation), the rest eager, the budget per "
        "block (offload and sharded runs always compile so)",
        applied_by="compile",
        sampled="choice",
        space_default=("model",),  # searched when a study lists blocks: --compile-scopes
        relevant=lambda s: blocks_compile(s) and not s.offload_every,
        render=lambda s: "compiled per block" if s.compile_scope == "blocks" else None,
    )
    optimizer_impl: Literal["as_written", "foreach", "fused"] = knob(
        "as_written",
        help="rebuild the optimizer with that flag: as_written, foreach or fused",
        applied_by="optimizer",
        sampled="choice",
        space_default=("as_written", "fused"),
        render=lambda s: f"optimizer {s.optimizer_impl}",
    )
    cuda_alloc_conf: str = knob(
        "",
        help="PYTORCH_CUDA_ALLOC_CONF of the process, e.g. expandable_segments:True",
        applied_by="allocator",
        sampled="choice",
        space_default=("",),
        space_default_cuda=("", EXPANDABLE),
        old_flag="--alloc-conf",
        old_plural="alloc_confs",
        render=lambda s: s.cuda_alloc_conf or None,
    )
    aggressive_recomputation: bool = knob(
        False,
        help="torch._functorch.config.aggressive_recomputation: lift the partitioner's bans "
        "on recompute (but reductions): less memory saved for backward, more recompute",
        applied_by="partitioner",
        functorch_key="aggressive_recomputation",
        sampled="choice",
        space_default=(False,),  # searched when a study lists true: the default space as it was
        relevant=compiled,
        render=lambda s: "aggressive recompute" if s.aggressive_recomputation else None,
    )
    micro_batch: int = knob(
        0,
        help="rows of one forward+backward: the workload builder's batch_size (0: the "
        "workload's own batch)",
        applied_by="batch",
        sampled="choice",
        plural="micro_batches",
        space_default=(0,),  # searched when a study lists sizes (with --global-batch)
        render=lambda s: f"micro-batch {s.micro_batch}" if s.micro_batch else None,
    )
    accum_steps: int = knob(
        1,
        help="forward+backward passes per optimizer step, the gradients kept between them "
        "(gradient accumulation); a search sets it from --global-batch",
        applied_by="batch",
        render=lambda s: f"accumulate {s.accum_steps}" if s.accum_steps > 1 else None,
    )
    seed: int = setting(0, help="seed of the step's randomness (dropout etc.)")
    warmup_steps: int = setting(2, help="untimed steps before measuring (compilation is here)")
    timed_steps: int = setting(5, help="steps timed after the memory-measured one")

    def __post_init__(self) -> None:
        budget = self.activation_memory_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise SpecError(f"activation_memory_budget must be a number, got {budget!r}")
        if not 0.0 <= float(budget) <= 1.0:
            raise SpecError(f"activation_memory_budget must be within [0, 1], got {budget}")
        object.__setattr__(self, "activation_memory_budget", float(budget))
        for name in ("recompute_ops_removed", "recompute_ops_added"):
            object.__setattr__(self, name, check_op_names(name, getattr(self, name)))
        overlap = set(self.recompute_ops_removed) & set(self.recompute_ops_added)
        if overlap:
            raise SpecError(f"ops both removed and added: {', '.join(sorted(overlap))}")
        if is_int(self.warmup_steps) and not 1 <= self.warmup_steps <= MAX_STEPS:
            raise SpecError(
                f"warmup_steps must be from 1 (compilation happens there) to {MAX_STEPS}"
            )
        if is_int(self.timed_steps) and not 1 <= self.timed_steps <= MAX_STEPS:
            raise SpecError(f"timed_steps must be from 1 to {MAX_STEPS}")
        if is_int(self.accum_steps) and not 1 <= self.accum_steps <= MAX_STEPS:
            raise SpecError(f"accum_steps must be from 1 to {MAX_STEPS}")
        for k in KNOBS:
            if k.value_type is not float and k.value_type is not tuple:
                k.check(getattr(self, k.name))
        if self.offload_every and self.compile_mode in CUDA_GRAPH_MODES:
            raise SpecError(
                f"offload_every does not go with compile_mode {self.compile_mode!r}: CUDA "
                "graphs overwrite their memory at the next replay while the copy to host memory "
                "may still read it; use default or max-autotune-no-cudagraphs"
            )
        if self.compiled_offload and not self.is_compiled:
            raise SpecError(
                "block_ac_policy 'op_offload' is the partitioner's activation offloading and "
                "needs torch.compile; eager, use offload_every (saved-tensor hooks) or op"
            )
        if self.compile_backend != "inductor" and self.compile_mode not in ("default", "eager"):
            raise SpecError(f"compile_mode {self.compile_mode!r} needs compile_backend 'inductor'")
        parse_settings(self.cuda_alloc_conf)  # torch aborts the process on a malformed one

    @property
    def samples_per_step(self) -> int:
        """Rows per optimizer step (micro-batch x accumulation); 0 when the micro-batch is the
        workload's own (known only once built)."""
        return self.micro_batch * self.accum_steps

    def ranked_ms(self, step_time_ms: float, rows: int = 0) -> float:
        """A step time as a search ranks it: scaled to ``rows`` rows per optimizer step, so
        that configurations of different micro-batches compare by samples per second (a
        search over micro-batches without a global batch: issue 46); as it is when ``rows`` is
        0 (every trial's step is of the same rows) or the rows are the workload's own."""
        if not rows or not self.samples_per_step:
            return step_time_ms
        return step_time_ms * rows / self.samples_per_step

    @property
    def is_compiled(self) -> bool:
        """Whether the model goes through `torch.compile` (the partitioner knobs matter)."""
        return self.compile_mode != "eager"

    @property
    def compiles_blocks(self) -> bool:
        """Each repeated block compiled on its own, the rest eager (scope blocks, or offload)."""
        return self.is_compiled and (self.compile_scope == "blocks" or self.offload_every > 0)

    @property
    def compiled_offload(self) -> bool:
        """Whether blocks are marked for the partitioner's activation offloading
        (``block_ac_policy="op_offload"`` on checkpointed blocks)."""
        return bool(self.block_ac_every) and self.block_ac_policy == "op_offload"

    @property
    def offloads(self) -> bool:
        """Whether any saved activation goes to host memory: ``offload_every`` (hooks) or the
        compiled offload (`compiled_offload`)."""
        return bool(self.offload_every) or self.compiled_offload

    def partition_variant(self) -> str:
        """A stable name for everything the compile caches cannot see or do not key on.

        AOTAutograd's cache key ignores the knapsack solver and runtime estimator and cannot see
        a patched op list (measured on torch 2.13), so each such variant gets its own cache
        directory. The budget is keyed by torch itself, so it is not part of the variant, but
        whether it lies strictly between 0 and 1 is: there the joint pass that keeps random
        draws runs (`partitioner.keep_random_draws`), which the key ignores. A partitioner
        knob added since is part of it where it is not at its default.
        """
        removed = "+".join(op.split(".", 1)[1] for op in self.recompute_ops_removed) or "none"
        added = "+".join(op.split(".", 1)[1] for op in self.recompute_ops_added) or "none"
        extra = "".join(
            f"-{k.name}_{getattr(self, k.name)}"
            for k in KNOBS
            if k.functorch_key is not None
            and k.name not in _VARIANT_KEYED
            and getattr(self, k.name) != k.default
        )
        if self.compiled_offload:
            extra += "-ac_op_offload"  # the partitioner's offload settings are on
        if 0.0 < self.activation_memory_budget < 1.0:
            extra += "-rng_saved"
        return (
            f"{self.knapsack_solver}-{self.runtime_estimator}-{self.compile_backend}"
            f"-rm_{removed}-add_{added}{extra}"
        )

    def describe(self) -> str:
        """A short human description: ``budget 0.62, AC every 2 (full), optimizer fused``,
        each relevant knob's `Knob.render` in declaration order (study-wide ones left out)."""
        parts = [
            k.render(self) for k in KNOBS if k.is_knob and not k.study_wide and k.relevant(self)
        ]
        return ", ".join(p for p in parts if p)

    def describe_study(self) -> str:
        """The study-wide knobs not at their default (``backend aot_eager_decomp_partition``)."""
        parts = [k.render(self) for k in KNOBS if k.study_wide and k.relevant(self)]
        return ", ".join(p for p in parts if p)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (lists for tuples)."""
        data = dataclasses.asdict(self)
        data["recompute_ops_removed"] = list(self.recompute_ops_removed)
        data["recompute_ops_added"] = list(self.recompute_ops_added)
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> TrialSpec:
        """Build from the JSON form; unknown keys are an error, missing keys take defaults
        (a spec stored before a knob existed runs with the knob at its default, as it did).

        Raises:
            SpecError: on an unknown key or an invalid value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown TrialSpec key(s): {', '.join(unknown)}")
        values = dict(data)
        for name in ("recompute_ops_removed", "recompute_ops_added"):
            if name in values:
                if not isinstance(values[name], (list, tuple)):  # "aten.mm" read as 7 names
                    got = shown_value(values[name])
                    raise SpecError(f"{name} must be a list of op names, got {got}")
                values[name] = tuple(values[name])
        return cls(**values)

    def replace(self, **changes: Any) -> TrialSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


KNOBS: tuple[Knob, ...] = knobs_of(TrialSpec)
"""Every field of `TrialSpec` as a `Knob` (the step settings too: see `Knob.is_knob`)."""
KNOB_BY_NAME: Mapping[str, Knob] = by_name(KNOBS)
_VARIANT_KEYED = ("activation_memory_budget", "knapsack_solver", "runtime_estimator")
