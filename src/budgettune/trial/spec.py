"""`TrialSpec` (one configuration of the recompute knobs) and `TrialRun` (one trial to launch).

Both are frozen, validated dataclasses; their field names are the JSON keys of ``SPEC.json``
(the parent/child contract, see DESIGN.md §3). Op *names* are checked for syntax here; whether
an op exists is checked by `recompute.py` in the child, which is the only place torch is imported.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from budgettune.errors import SpecError
from budgettune.trial.allocator import parse_settings

KNAPSACK_SOLVERS = ("dp", "greedy", "ilp")
RUNTIME_ESTIMATORS = ("flops", "profile")
COMPILE_MODES = (
    "eager",
    "default",
    "max-autotune-no-cudagraphs",
    "reduce-overhead",
    "max-autotune",
)
COMPILE_BACKENDS = ("inductor", "aot_eager_decomp_partition")
BLOCK_AC_POLICIES = ("full", "op")
OPTIMIZER_IMPLS = ("as_written", "foreach", "fused")
EXPANDABLE = "expandable_segments:True"
"""The ``cuda_alloc_conf`` that ends the caching allocator's fragmentation (CUDA)."""
DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+(,\d+)*)?)$")
"""``cpu``, ``cuda``, ``cuda:N`` or a GPU group ``cuda:0,1`` (one GPU per rank)."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
"""Process-group timeout of a sharded trial: a collective waiting longer fails the rank (NCCL's
watchdog aborts it), so a rank that hangs instead of dying cannot hang the trial. Five
minutes is above any step budgettune measures, and far below the trial's own timeout."""
OP_NAME_PATTERN = re.compile(r"^(aten|prims)\.[A-Za-z_][A-Za-z0-9_]*$")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"unknown {name} {value!r}; choose one of: {', '.join(choices)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSpec:
    """One configuration of every recompute knob budgettune searches."""

    activation_memory_budget: float = 1.0
    """`torch._functorch.config.activation_memory_budget`, 0 (recompute all) .. 1 (default)."""
    recompute_ops_removed: tuple[str, ...] = ()
    """aten/prims op names taken out of the partitioner's recomputable list (e.g. ``aten.add``)."""
    recompute_ops_added: tuple[str, ...] = ()
    """aten op names put into the recomputable list (e.g. ``aten.mm``)."""
    knapsack_solver: str = "dp"
    """`activation_memory_budget_solver`: dp, greedy or ilp (ilp needs scipy)."""
    runtime_estimator: str = "flops"
    """`activation_memory_budget_runtime_estimator`: flops or profile (profile needs CUDA)."""
    compile_mode: str = "default"
    """`torch.compile` mode, or ``eager`` for no compile at all."""
    compile_backend: str = "inductor"
    """``inductor`` or ``aot_eager_decomp_partition`` (same partitioner, no codegen)."""
    block_ac_every: int = 0
    """0 = off; k = non-reentrant `torch.utils.checkpoint` on every k-th repeated block."""
    block_ac_policy: str = "full"
    """``full`` recomputes the whole block; ``op`` is torchtitan's selective op policy (save
    matmul and attention outputs, except every second mm)."""
    optimizer_impl: str = "as_written"
    """``as_written``, ``foreach`` or ``fused``: rebuild the optimizer with that flag."""
    cuda_alloc_conf: str = ""
    """``PYTORCH_CUDA_ALLOC_CONF`` for the trial process, e.g. ``expandable_segments:True``."""
    seed: int = 0
    """Seed for parameters-independent randomness in the step (dropout etc.)."""
    warmup_steps: int = 2
    """Untimed steps before measuring (compilation happens here)."""
    timed_steps: int = 5
    """Steps timed after the memory-measured step; median and p10/p90 are reported."""

    def __post_init__(self) -> None:
        budget = self.activation_memory_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise SpecError(f"activation_memory_budget must be a number, got {budget!r}")
        if not 0.0 <= float(budget) <= 1.0:
            raise SpecError(f"activation_memory_budget must be within [0, 1], got {budget}")
        object.__setattr__(self, "activation_memory_budget", float(budget))
        for name in ("recompute_ops_removed", "recompute_ops_added"):
            ops = tuple(getattr(self, name))
            for op in ops:
                if not isinstance(op, str) or not OP_NAME_PATTERN.match(op):
                    raise SpecError(
                        f"{name}: {op!r} is not an op name; write it like aten.add or aten.mm"
                    )
            object.__setattr__(self, name, tuple(sorted(set(ops))))
        overlap = set(self.recompute_ops_removed) & set(self.recompute_ops_added)
        if overlap:
            raise SpecError(f"ops both removed and added: {', '.join(sorted(overlap))}")
        _check_choice("knapsack_solver", self.knapsack_solver, KNAPSACK_SOLVERS)
        _check_choice("runtime_estimator", self.runtime_estimator, RUNTIME_ESTIMATORS)
        _check_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        _check_choice("compile_backend", self.compile_backend, COMPILE_BACKENDS)
        _check_choice("block_ac_policy", self.block_ac_policy, BLOCK_AC_POLICIES)
        _check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.compile_backend != "inductor" and self.compile_mode not in ("default", "eager"):
            raise SpecError(f"compile_mode {self.compile_mode!r} needs compile_backend 'inductor'")
        for name in ("block_ac_every", "seed", "warmup_steps", "timed_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{name} must be a non-negative integer, got {value!r}")
        if self.warmup_steps < 1:
            raise SpecError("warmup_steps must be at least 1 (compilation happens there)")
        if self.timed_steps < 1:
            raise SpecError("timed_steps must be at least 1")
        if not isinstance(self.cuda_alloc_conf, str):
            raise SpecError(f"cuda_alloc_conf must be a string, got {self.cuda_alloc_conf!r}")
        parse_settings(self.cuda_alloc_conf)  # torch aborts the process on a malformed one

    @property
    def is_compiled(self) -> bool:
        """Whether the model goes through `torch.compile` (the partitioner knobs matter)."""
        return self.compile_mode != "eager"

    def partition_variant(self) -> str:
        """A stable name for everything the compile caches cannot see or do not key on.

        AOTAutograd's cache key ignores the knapsack solver and runtime estimator and cannot see
        a patched op list (measured on torch 2.13), so each such variant gets its own cache
        directory. The budget is keyed by torch itself, so it is not part of the variant.
        """
        removed = "+".join(op.split(".", 1)[1] for op in self.recompute_ops_removed) or "none"
        added = "+".join(op.split(".", 1)[1] for op in self.recompute_ops_added) or "none"
        return (
            f"{self.knapsack_solver}-{self.runtime_estimator}-{self.compile_backend}"
            f"-rm_{removed}-add_{added}"
        )

    def describe(self) -> str:
        """A short human description: ``budget 0.62, AC every 2 (full), optimizer fused``."""
        parts = []
        if self.compile_mode == "eager":
            parts.append("eager")
        else:
            parts.append(f"budget {self.activation_memory_budget:.2f}")
            if self.activation_memory_budget < 1.0 and self.knapsack_solver != "dp":
                parts.append(f"solver {self.knapsack_solver}")
            if self.runtime_estimator != "flops":
                parts.append(f"estimator {self.runtime_estimator}")
            if self.compile_mode != "default":
                parts.append(self.compile_mode)
        if self.recompute_ops_removed:
            parts.append("-" + ",".join(op.split(".", 1)[1] for op in self.recompute_ops_removed))
        if self.recompute_ops_added:
            parts.append("+" + ",".join(op.split(".", 1)[1] for op in self.recompute_ops_added))
        if self.block_ac_every:
            parts.append(f"AC every {self.block_ac_every} ({self.block_ac_policy})")
        parts.append(f"optimizer {self.optimizer_impl}")
        if self.cuda_alloc_conf:
            parts.append(self.cuda_alloc_conf)
        return ", ".join(parts)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (lists for tuples)."""
        data = dataclasses.asdict(self)
        data["recompute_ops_removed"] = list(self.recompute_ops_removed)
        data["recompute_ops_added"] = list(self.recompute_ops_added)
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> TrialSpec:
        """Build from the JSON form; unknown keys are an error, missing keys take defaults.

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
                values[name] = tuple(values[name])
        return cls(**values)

    def replace(self, **changes: Any) -> TrialSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRun:
    """Everything the child process needs to measure one `TrialSpec`: the ``SPEC.json`` file."""

    spec: TrialSpec
    """The configuration to measure."""
    workload: str
    """Workload reference: ``builtin:NAME``, ``path/to/file.py:fn`` or ``pkg.module:fn``."""
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the workload builder (e.g. ``{"batch_size": 8}``)."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    cache_root: str | None = None
    """Root of the per-variant compile-cache directories; None turns the compile caches off."""
    nproc_per_node: int = 1
    """Ranks of the trial: above 1 it runs under ``torch.distributed.run``, sharded (FSDP2)."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Process-group timeout of a sharded trial (see `DEFAULT_COLLECTIVE_TIMEOUT_S`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, TrialSpec):
            raise SpecError("TrialRun.spec must be a TrialSpec")
        if not isinstance(self.workload, str) or not self.workload.strip():
            raise SpecError("workload reference must be a non-empty string")
        if not DEVICE_PATTERN.match(self.device):
            raise SpecError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        check_world(self.device, self.nproc_per_node)
        if not self.collective_timeout_s > 0:
            raise SpecError(
                f"collective timeout must be positive, got {self.collective_timeout_s}"
            )
        object.__setattr__(self, "workload_options", dict(self.workload_options))

    @property
    def is_cuda(self) -> bool:
        """Whether the trial runs on a CUDA device."""
        return self.device.startswith("cuda")

    def cache_dir(self) -> str | None:
        """The compile-cache directory of this run's partition variant (None: caches off)."""
        if self.cache_root is None:
            return None
        return f"{self.cache_root.rstrip('/')}/{self.spec.partition_variant()}"

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form written to ``SPEC.json``."""
        return {
            "spec": self.spec.to_json_dict(),
            "workload": self.workload,
            "workload_options": dict(self.workload_options),
            "device": self.device,
            "cache_root": self.cache_root,
            "nproc_per_node": self.nproc_per_node,
            "collective_timeout_s": self.collective_timeout_s,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> TrialRun:
        """Build from the JSON form.

        Raises:
            SpecError: on unknown keys or invalid values.
        """
        known = {"spec", "workload", "workload_options", "device", "cache_root"}
        known |= {"nproc_per_node", "collective_timeout_s"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown TrialRun key(s): {', '.join(unknown)}")
        return cls(
            spec=TrialSpec.from_json_dict(data["spec"]),
            workload=data["workload"],
            workload_options=data.get("workload_options", {}),
            device=data.get("device", "cpu"),
            cache_root=data.get("cache_root"),
            nproc_per_node=int(data.get("nproc_per_node", 1)),
            collective_timeout_s=float(
                data.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S)
            ),
        )


def check_world(device: str, nproc_per_node: int) -> None:
    """A device and a rank count that go together: a GPU group lists one GPU per rank.

    Raises:
        SpecError: fewer than 1 rank, ``cuda:N`` for several ranks, or a group of another size.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):
        raise SpecError(f"nproc_per_node must be an integer, got {nproc_per_node!r}")
    if nproc_per_node < 1:
        raise SpecError(f"nproc_per_node must be at least 1, got {nproc_per_node}")
    if ":" not in device:
        return
    gpus = device.split(":", 1)[1].split(",")
    if len(gpus) != nproc_per_node and not (len(gpus) == 1 and nproc_per_node == 1):
        raise SpecError(
            f"device {device} names {len(gpus)} GPU(s) for {nproc_per_node} rank(s): list one "
            "GPU per rank (e.g. cuda:0,1 for --nproc-per-node 2), or write cuda"
        )
