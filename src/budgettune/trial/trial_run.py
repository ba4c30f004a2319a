"""`TrialRun`: one trial to launch, the ``SPEC.json`` file the child reads (the parent/child
contract), with the device rules of a trial (`check_world`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from budgettune.errors import SpecError
from budgettune.trial.spec import TrialSpec

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+(,\d+)*)?)$")
"""``cpu``, ``cuda``, ``cuda:N`` or a GPU group ``cuda:0,1`` (one GPU per rank)."""
DEFAULT_TRIAL_TIMEOUT_S = 900.0
"""Wall-clock limit of one trial process (a search's, `budgettune trial`'s, `verify`'s)."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
"""Process-group timeout of a sharded trial: a collective waiting longer fails the rank (NCCL's
watchdog aborts it), so a rank that hangs instead of dying cannot hang the trial. Five
minutes is above any step budgettune measures, and far below the trial's own timeout."""


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
    shared_gpu: bool = False
    """Other trials may run on this trial's GPU at the same time: it takes turns with them
    (`budgettune.trial.gpu_turns`: only compiles overlap; nothing else runs while it
    measures). A one-rank CUDA trial only."""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, TrialSpec):
            raise SpecError("TrialRun.spec must be a TrialSpec")
        if not isinstance(self.workload, str) or not self.workload.strip():
            raise SpecError("workload reference must be a non-empty string")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise SpecError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        check_world(self.device, self.nproc_per_node)
        if self.shared_gpu and (not self.is_cuda or self.nproc_per_node > 1):
            raise SpecError("a shared GPU is for one-rank CUDA trials only")
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
            "shared_gpu": self.shared_gpu,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> TrialRun:
        """Build from the JSON form.

        Raises:
            SpecError: on unknown keys or invalid values.
        """
        known = {"spec", "workload", "workload_options", "device", "cache_root"}
        known |= {"nproc_per_node", "collective_timeout_s", "shared_gpu"}
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
            shared_gpu=bool(data.get("shared_gpu", False)),
        )


MAX_WORLD_SIZE = 4096
"""The most ranks a trial (and a pin) may have."""


def check_world(device: str, nproc_per_node: int) -> None:
    """A device and a rank count that go together: a GPU group lists one GPU per rank.

    Raises:
        SpecError: fewer than 1 rank or more than `MAX_WORLD_SIZE`, more CPU ranks than this
            host has cores, ``cuda:N`` for several ranks, or a group of another size.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):
        raise SpecError(f"nproc_per_node must be an integer, got {nproc_per_node!r}")
    if not 1 <= nproc_per_node <= MAX_WORLD_SIZE:
        raise SpecError(
            f"nproc_per_node must be an integer from 1 to {MAX_WORLD_SIZE}, got {nproc_per_node}"
        )
    cores = os.cpu_count() or 1
    if device == "cpu" and nproc_per_node > cores:  # issue 48: a pin's 4096 ranks on 2 cores
        raise SpecError(
            f"{nproc_per_node} CPU ranks on a host of {cores} cores: a sharded CPU trial runs "
            "at most one rank a core"
        )
    if ":" not in device:
        return
    gpus = device.split(":", 1)[1].split(",")
    if len(gpus) != nproc_per_node and not (len(gpus) == 1 and nproc_per_node == 1):
        raise SpecError(
            f"device {device} names {len(gpus)} GPU(s) for {nproc_per_node} rank(s): list one "
            "GPU per rank (e.g. cuda:0,1 for --nproc-per-node 2), or write cuda"
        )
