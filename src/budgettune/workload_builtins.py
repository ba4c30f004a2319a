"""The built-in workloads (``builtin:NAME``): their table, read by the parent without importing
torch, and the bounds of their size options (issue 48, P4: ``-o n_layers=100000000`` built
blocks until the host's memory ran out). torch and psutil are imported at call time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from budgettune.errors import WorkloadError


@dataclass(frozen=True, kw_only=True, slots=True)
class BuiltinWorkload:
    """An entry of the built-in workload table (`budgettune workloads`)."""

    name: str
    """The name after ``builtin:``."""
    target: str
    """``pkg.module:fn`` of its builder."""
    description: str
    """One line for the listing."""
    default_device: str
    """``cpu`` or ``cuda``: where it is meant to run."""


BUILTINS: tuple[BuiltinWorkload, ...] = (
    BuiltinWorkload(
        name="tiny-gpt",
        target="budgettune.workloads.tiny_gpt:build",
        description="4-layer GPT, d_model 256, B=4 T=192, fp32: ~0.3 s/step, ~140 MB on CPU",
        default_device="cpu",
    ),
    BuiltinWorkload(
        name="llama",
        target="budgettune.workloads.llama:build",
        description=(
            "Llama-3.2-1B shape (GQA, bf16, untied head: 1.50B params), B=4 T=1024: "
            "the GPU reference"
        ),
        default_device="cuda",
    ),
    BuiltinWorkload(
        name="vit",
        target="budgettune.workloads.vit:build",
        description="ViT-B/16 shape (86M params, bf16), 224px images, B=64",
        default_device="cuda",
    ),
)
"""The built-in workloads, referenced as ``builtin:NAME``."""


BUILTIN_MAX_LAYERS, BUILTIN_MAX_SIZE = 1024, 2**20
"""The most blocks, and the largest other size option, of a built-in workload."""


def check_builtin_bounds(ref: str, options: Mapping[str, Any]) -> None:
    """The bounds of a built-in's size options, in the parent (no torch): each an integer
    from 1 to its bound (the fifth probe: refused only in the trial child, exit 1).

    Raises:
        WorkloadError: in one line.
    """
    for name, value in options.items():
        if name in ("seed", "rope_theta") or isinstance(value, bool | str):
            continue
        most = BUILTIN_MAX_LAYERS if name == "n_layers" else BUILTIN_MAX_SIZE
        if not isinstance(value, int):
            raise WorkloadError(
                f"workload {ref}: option {name} must be an integer, got {value!r:.40}"
            )
        if not 1 <= value <= most:
            raise WorkloadError(
                f"workload {ref}: option {name} must be from 1 to {most}, got {value}"
            )


def check_builtin_sizes(ref: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """`check_builtin_bounds`, then refuse a built-in whose parameters, gradients and two
    moments (counted on the meta device) exceed the host's memory (issue 48, P4)."""
    import psutil
    import torch

    check_builtin_bounds(ref, options)  # as the parent did (a pin's options come here first)
    meta = fn(torch.device("meta"), **options).model
    need, total = 4 * sum(p.nbytes for p in meta.parameters()), psutil.virtual_memory().total
    if need > total:
        raise WorkloadError(
            f"workload {ref}: its parameters, gradients and optimizer moments alone need about "
            f"{need / 1e9:.1f} GB, more than this host's {total / 1e9:.1f} GB of memory"
        )
