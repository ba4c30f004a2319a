"""What identifies a workload for a pinned config: its parameters and its batch shapes.

Re-exported by `budgettune.workload`; torch is imported at call time only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from budgettune.errors import SpecError

if TYPE_CHECKING:
    import torch
    from torch import nn


class BuiltStep(Protocol):
    """What the fingerprint reads of a built workload (a `budgettune.Workload`)."""

    @property
    def model(self) -> nn.Module:
        """The model."""
        ...

    @property
    def batch(self) -> Any:
        """The batch pytree."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadFingerprint:
    """What identifies a workload for a pinned config: its parameters and its batch shapes."""

    param_count: int
    """Number of parameter elements (shared parameters counted once)."""
    param_bytes: int
    """Bytes of the parameters."""
    batch: tuple[str, ...]
    """``dtype[shape]`` (``int64[4, 192]``) of each tensor leaf of the batch, in pytree order."""
    digest: str
    """16 hex digits of a sha256 over the count, each parameter's shape and dtype, and batch."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch", tuple(self.batch))

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "batch": list(self.batch),
            "digest": self.digest,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> WorkloadFingerprint:
        """Build from the JSON form.

        Raises:
            SpecError: on missing or unknown keys.
        """
        known = {"param_count", "param_bytes", "batch", "digest"}
        if set(data) != known:
            raise SpecError(
                f"a workload fingerprint has keys {', '.join(sorted(known))}; "
                f"got {', '.join(sorted(data))}"
            )
        return cls(
            param_count=int(data["param_count"]),
            param_bytes=int(data["param_bytes"]),
            batch=tuple(str(item) for item in data["batch"]),
            digest=str(data["digest"]),
        )


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def fingerprint(workload: BuiltStep) -> WorkloadFingerprint:
    """The fingerprint of a built workload (works on the meta device too)."""
    import torch
    from torch.utils import _pytree as pytree

    params = list(workload.model.parameters())
    batch = tuple(
        _describe(leaf)
        for leaf in pytree.tree_leaves(workload.batch)
        if isinstance(leaf, torch.Tensor)
    )
    param_count = sum(p.numel() for p in params)
    hasher = hashlib.sha256(str(param_count).encode())
    for param in params:
        hasher.update(_describe(param).encode())
    for item in batch:
        hasher.update(item.encode())
    return WorkloadFingerprint(
        param_count=param_count,
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        batch=batch,
        digest=hasher.hexdigest()[:16],
    )
