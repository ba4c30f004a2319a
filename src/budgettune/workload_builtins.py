"""The built-in workloads (``builtin:NAME``): their table, read by the parent without importing
torch, and the bounds of their size options (issue 48, P4: ``-o n_layers=100000000`` built
blocks until the host's memory ran out). torch and psutil are imported at call time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from budgettune.errors import WorkloadError, shown_value


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
    options: Mapping[str, type]
    """Its builder's options and their types, so that the parent refuses an option it does not
    take, or of another type, before any trial (issue 48's P6-10; a test holds the table to the
    builders' signatures)."""


_SIZES = ("batch_size", "n_layers", "n_heads")


BUILTINS: tuple[BuiltinWorkload, ...] = (
    BuiltinWorkload(
        name="tiny-gpt",
        target="budgettune.workloads.tiny_gpt:build",
        description="4-layer GPT, d_model 256, B=4 T=192, fp32: ~0.3 s/step, ~140 MB on CPU",
        default_device="cpu",
        options={
            **dict.fromkeys(("vocab_size", "d_model", *_SIZES, "seq_len", "seed"), int),
            "tie_embeddings": bool,
        },
    ),
    BuiltinWorkload(
        name="llama",
        target="budgettune.workloads.llama:build",
        description=(
            "Llama-3.2-1B shape (GQA, bf16, untied head: 1.50B params), B=4 T=1024: "
            "the GPU reference"
        ),
        default_device="cuda",
        options={
            **dict.fromkeys(
                ("dim", *_SIZES, "n_kv_heads", "ffn_dim", "vocab_size", "seq_len", "seed"), int
            ),
            "rope_theta": float,
            "tie_embeddings": bool,
            "fp32_loss": bool,
        },
    ),
    BuiltinWorkload(
        name="vit",
        target="budgettune.workloads.vit:build",
        description="ViT-B/16 shape (86M params, bf16), 224px images, B=64",
        default_device="cuda",
        options=dict.fromkeys(
            ("image_size", "patch_size", "dim", *_SIZES, "mlp_dim", "num_classes", "seed"), int
        ),
    ),
)
"""The built-in workloads, referenced as ``builtin:NAME``."""


BUILTIN_MAX_LAYERS, BUILTIN_MAX_SIZE = 1024, 2**20
"""The most blocks, and the largest other size option, of a built-in workload."""


def check_builtin_bounds(ref: str, options: Mapping[str, Any]) -> None:
    """A built-in's options, in the parent (no torch): each one its builder takes, of its
    type, a size an integer from 1 to its bound, a seed one torch takes (the fifth and sixth
    probes: refused only in the trial child, exit 1 after a crashed trial).

    Raises:
        WorkloadError: in one line.
    """
    name_of = ref.removeprefix("builtin:")
    entry = next((e for e in BUILTINS if e.name == name_of), None)
    if entry is None:
        return  # not a built-in: `check_reference` says so
    for name, value in options.items():
        kind = entry.options.get(name)
        if kind is None:
            raise WorkloadError(
                f"workload {ref} takes no option {shown_value(name)}; it takes "
                + ", ".join(sorted(entry.options))
            )
        if kind is bool and not isinstance(value, bool):
            raise WorkloadError(
                f"workload {ref}: option {name} is true or false, got {shown_value(value)}"
            )
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WorkloadError(
                    f"workload {ref}: option {name} must be a number, got {shown_value(value)}"
                )
            if not 0 < value <= 1e12:
                raise WorkloadError(f"workload {ref}: option {name} must be above 0, at most 1e12")
            continue
        if kind is bool:
            continue
        if name == "seed":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise WorkloadError(
                    f"workload {ref}: option seed must be an integer from 0 to 2**63 - 1, got "
                    f"{shown_value(value)}"
                )
            continue
        most = BUILTIN_MAX_LAYERS if name == "n_layers" else BUILTIN_MAX_SIZE
        if isinstance(value, bool) or not isinstance(value, int):  # True is no size (P6-9)
            raise WorkloadError(
                f"workload {ref}: option {name} must be an integer, got {shown_value(value)}"
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
