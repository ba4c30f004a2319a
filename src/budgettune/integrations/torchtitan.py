"""A pin as torchtitan job-config sections: ``budgettune export --format torchtitan``.

The keys follow torchtitan v0.2.2 (commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce,
2026-02-20), the last release whose job config is TOML: ``torchtitan/config/job_config.py``'s
``ActivationCheckpoint`` (``mode`` = ``none`` / ``full`` / ``selective`` / ``memory_budget``;
``selective_ac_option`` = ``"op"`` or a layer frequency ``"k"``, every k-th block checkpointed
whole, 1-based as budgettune's ``block_ac_every``; ``memory_budget``, read in
``memory_budget`` mode, which needs the model compiled), ``Compile`` (``enable``,
``backend``) and ``Optimizer`` (``implementation`` = ``for-loop`` / ``foreach`` / ``fused``).
torchtitan's main branch has since moved from TOML to Python config dataclasses (#2386,
2026-02-23: ``FullAC`` / ``SelectiveAC`` / ``MemoryBudgetAC(memory_budget=...)`` in
``torchtitan/distributed/activation_checkpoint.py``); the same choices map onto those.

What torchtitan's config cannot hold is listed (`TorchtitanConfig.not_expressed`): the
allocator setting (the launch environment's; torchtitan's ``run_train.sh`` exports
``PYTORCH_ALLOC_CONF=expandable_segments:True``), edits of the partitioner's recomputable-op
list, a knapsack solver or runtime estimator other than torch's defaults, a compile mode, an
optimizer kept "as written". A pin whose activation checkpointing torchtitan cannot express
at all (block AC and a budget together; the op policy on every k-th block) is refused.
torchtitan compiles each block on its own; a pin measured on one compiled model is a close,
not exact, match.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from budgettune.errors import PinnedConfigError
from budgettune.pinning import PinnedConfig
from budgettune.trial.partitioner import PARTITIONER_KNOBS
from budgettune.trial.spec import TrialSpec

TORCHTITAN_VERSION = "v0.2.2 (73a0e697)"
"""The torchtitan job config whose keys are written."""
_DEFAULT_SOLVER, _DEFAULT_ESTIMATOR = "dp", "flops"  # torch's functorch config defaults


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchtitanConfig:
    """The sections of a torchtitan job config that carry a pin."""

    sections: Mapping[str, Mapping[str, Any]]
    """``{"activation_checkpoint": {"mode": ...}, "compile": {...}, "optimizer": {...}}``."""
    not_expressed: tuple[str, ...]
    """What of the pin torchtitan's config cannot hold, one phrase each."""
    source: str = ""
    """The pin's path, for the header comment."""

    def to_toml(self) -> str:
        """The sections as TOML, with a header saying where they go."""
        lines = [
            f"# budgettune pin {_comment_text(self.source)} as torchtitan {TORCHTITAN_VERSION} "
            "job-config keys:",
            "# set these keys in the same sections of your job config",
        ]
        for section, keys in self.sections.items():
            lines += ["", f"[{section}]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
        return "\n".join(lines) + "\n"


def _comment_text(text: str) -> str:
    """``text`` safe inside a TOML comment: no line break or control character can end the
    comment and start a section (issue 48: a pin named ``x\n[job]`` injected one)."""
    return json.dumps(str(text))[1:-1]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string


def inexpressible(spec: TrialSpec) -> str | None:
    """What of ``spec``'s activation checkpointing torchtitan's config cannot express (None:
    it can): offload, block AC together with a memory budget, the op policy on every k-th
    block. `budgettune search --target torchtitan` keeps to configurations it can."""
    if spec.offloads:
        if spec.offload_every:
            return f"offload of every {spec.offload_every} block's activations"
        return "the op policy with what it saves offloaded (op_offload)"
    budget = spec.activation_memory_budget if spec.is_compiled else 1.0
    every, policy = spec.block_ac_every, spec.block_ac_policy
    if every and budget < 1.0:
        return (
            f"block AC (every {every}, {policy}) together with memory budget {budget}: its "
            "activation_checkpoint.mode is one or the other"
        )
    if every and policy == "op" and every != 1:
        return f"the op policy on one block in {every} (torchtitan's checkpoints every block)"
    return None


def _activation_checkpoint(pinned: PinnedConfig) -> dict[str, Any]:
    spec = pinned.spec
    reason = inexpressible(spec)
    if reason is not None:
        raise PinnedConfigError(
            f"{pinned.path}: torchtitan's activation_checkpoint section cannot express "
            f"{reason}; apply the pin with budgettune.load_pinned in the training script, or "
            "search with --target torchtitan"
        )
    budget = spec.activation_memory_budget if spec.is_compiled else 1.0
    every, policy = spec.block_ac_every, spec.block_ac_policy
    if every and policy == "op":
        return {"mode": "selective", "selective_ac_option": "op"}
    if every == 1:
        return {"mode": "full"}
    if every:
        return {"mode": "selective", "selective_ac_option": str(every)}
    if budget < 1.0:
        return {"mode": "memory_budget", "memory_budget": budget}
    return {"mode": "none"}


_EXPRESSED = ("activation_memory_budget", "knapsack_solver", "runtime_estimator")
"""Partitioner knobs said above: the budget is torchtitan's ``memory_budget``."""


def _not_expressed(pinned: PinnedConfig) -> list[str]:
    spec = pinned.spec
    missed = []
    if spec.cuda_alloc_conf:
        missed.append(
            f"the allocator setting (launch with PYTORCH_CUDA_ALLOC_CONF={spec.cuda_alloc_conf}; "
            "torchtitan's run_train.sh exports PYTORCH_ALLOC_CONF=expandable_segments:True)"
        )
    if spec.recompute_ops_removed or spec.recompute_ops_added:
        edits = [f"-{op}" for op in spec.recompute_ops_removed]
        edits += [f"+{op}" for op in spec.recompute_ops_added]
        missed.append(f"the recomputable-op edits ({' '.join(edits)})")
    if spec.is_compiled and spec.activation_memory_budget < 1.0:
        if spec.knapsack_solver != _DEFAULT_SOLVER:
            missed.append(f"the knapsack solver {spec.knapsack_solver}")
        if spec.runtime_estimator != _DEFAULT_ESTIMATOR:
            missed.append(f"the runtime estimator {spec.runtime_estimator}")
    if spec.is_compiled and spec.compile_mode != "default":
        missed.append(f"compile mode {spec.compile_mode}")
    if spec.is_compiled and not spec.compiles_blocks:
        missed.append(
            "the compile of the whole model (torchtitan compiles block by block: search with "
            "--compile-scopes blocks for pins it runs as measured)"
        )
    for k in PARTITIONER_KNOBS:  # any other partitioner setting, as set on the pin
        value = getattr(spec, k.name)
        if k.name not in _EXPRESSED and value != k.default and k.relevant(spec):
            missed.append(f"the partitioner setting {k.functorch_key}={value}")
    if spec.optimizer_impl == "as_written":
        missed.append(
            "the optimizer as written (the workload's own flags; torchtitan's "
            "optimizer.implementation defaults to fused)"
        )
    return missed


def torchtitan_config(pinned: PinnedConfig) -> TorchtitanConfig:
    """The torchtitan job-config sections of a pin, and what they leave out.

    Raises:
        PinnedConfigError: the pin's activation checkpointing has no torchtitan equivalent.
    """
    spec = pinned.spec
    sections: dict[str, dict[str, Any]] = {"activation_checkpoint": _activation_checkpoint(pinned)}
    sections["compile"] = {"enable": spec.is_compiled}
    if spec.is_compiled:
        sections["compile"]["backend"] = spec.compile_backend
    if spec.optimizer_impl != "as_written":
        sections["optimizer"] = {"implementation": spec.optimizer_impl}
    if spec.micro_batch:  # torchtitan accumulates global / (local x data-parallel ranks)
        sections["training"] = {
            "local_batch_size": spec.micro_batch,
            "global_batch_size": spec.samples_per_step * pinned.pin.world_size,
        }
    return TorchtitanConfig(
        sections=sections, not_expressed=tuple(_not_expressed(pinned)), source=pinned.path
    )
