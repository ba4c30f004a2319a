"""The configuration sets that `benchmarks.reference` measures, as a table, and `configs`,
which expands one into the configurations it measures, in order.

A set is a few blocks of rows. A row is one configuration, or one per combination of
its axes' values (the first axis outermost), each value putting its text into the label's
``{}`` and its setting into the spec: ``Row("budget-{}", "budget", axes=(budgets(1.0, 0.5),))``
is ``budget-1.0`` and ``budget-0.5``. A block gives its rows the workload and its options, and
repeats them once per choice of ``each`` (the choice's text prefixes the labels, its spec and
options join every row's). Every configuration takes the command's ``--warmup``/``--timed``
steps unless its block fixes them. A setting given twice to one configuration is an error of
the table, not an override.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from budgettune.trial.spec import EXPANDABLE


@dataclass(frozen=True)
class Choice:
    """One value of an axis (or of a block's ``each``): its label text and what it sets."""

    text: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Workload options (``-o``)."""


Axis = tuple[Choice, ...]


def axis(key: str, *values: Any, fmt: str = "{}") -> Axis:
    """The values of one spec field, each labelled ``fmt.format(value)``."""
    return tuple(Choice(fmt.format(value), {key: value}) for value in values)


def budgets(*values: float) -> Axis:
    """Activation memory budgets, labelled with one decimal (``0.7``)."""
    return axis("activation_memory_budget", *values, fmt="{:.1f}")


def every(*values: int) -> Axis:
    """Block AC strides (checkpoint every k-th block)."""
    return axis("block_ac_every", *values)


@dataclass(frozen=True)
class Row:
    """A configuration, or one per combination of its axes."""

    label: str
    """The label, one ``{}`` per axis."""
    family: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()


@dataclass(frozen=True)
class Block:
    """Rows on one workload, repeated for each choice of ``each``."""

    workload: str
    rows: tuple[Row, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)
    each: Axis = (Choice(""),)
    steps: tuple[int, int] | None = None
    """(warm-up, timed) steps of every row; None: the command's."""


@dataclass(frozen=True)
class ConfigSet:
    """A named set: what it measures (for ``--help``) and its blocks."""

    about: str
    blocks: tuple[Block, ...]


def _merged(label: str, *parts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key in out:
                raise ValueError(f"{label}: {key} is set twice")
            out[key] = value
    return out


def expand(blocks: Sequence[Block], *, warmup: int, timed: int) -> list[dict[str, Any]]:
    """The configurations of ``blocks``, in the order they are measured: each a dict of
    ``label``, ``family``, ``workload``, ``options`` and ``spec`` (`TrialSpec`'s fields)."""
    out = []
    for block in blocks:
        warm, timed_steps = block.steps or (warmup, timed)
        steps = {"warmup_steps": warm, "timed_steps": timed_steps}
        for outer in block.each:
            for row in block.rows:
                for choices in itertools.product(*row.axes):
                    label = outer.text + row.label.format(*(c.text for c in choices))
                    options = [block.options, outer.options, *(c.options for c in choices)]
                    spec = [block.spec, outer.spec, row.spec, *(c.spec for c in choices), steps]
                    out.append(
                        {
                            "label": label,
                            "family": row.family,
                            "workload": block.workload,
                            "options": _merged(label, *options),
                            "spec": _merged(label, *spec),
                        }
                    )
    return out


LLAMA, VIT, TINY = "builtin:llama", "builtin:vit", "builtin:tiny-gpt"
TENTHS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
"""Every budget from 1.0 down to 0.0 in steps of 0.1."""
EAGER = {"compile_mode": "eager"}
FUSED = {"optimizer_impl": "fused"}
OP = {"block_ac_policy": "op"}
NOSAC = {"activation_memory_budget": 0.99, "recompute_ops_removed": ("aten.add",)}
"""Budget 0.99 with ``aten.add`` taken out of the recomputable ops."""
SMOKE = {"compile_backend": "aot_eager_decomp_partition", **EAGER}
ALLOCATORS = (
    Choice("", {"cuda_alloc_conf": ""}),
    Choice("-expandable", {"cuda_alloc_conf": EXPANDABLE}),
)
"""The default allocator, then expandable segments (labelled ``-expandable``)."""

WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    # GPT-2 medium, the README's transformers example
    "gpt2m": (
        "hf:gpt2",
        {"n_layer": 24, "n_embd": 1024, "n_head": 16, "batch_size": 8, "seq_len": 1024},
    ),
    # Llama-3.2-1B's shape through transformers (not the built-in Llama)
    "llama1b": (
        "hf:llama",
        {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "max_position_embeddings": 131072,
            "batch_size": 4,
            "seq_len": 2048,
        },
    ),
    # ViT-B/16 through transformers (not builtin:vit)
    "vit": ("hf:vit", {"batch_size": 128}),
}
"""Issue 30's transformers workloads (`benchmarks.grid_vs_search`): (reference, options)."""
AS_WRITTEN = {"optimizer_impl": "as_written", "cuda_alloc_conf": ""}
LEAN = {"optimizer_impl": "fused", "cuda_alloc_conf": EXPANDABLE}


def grid30(name: str) -> tuple[Block, ...]:
    """Issue 30's hand grid of one of `WORKLOADS` (19 configurations, labels ``NAME-...``):
    budget 1.0 and block AC every 1, 2, 4 blocks x the full and op policies, both as written and
    lean (fused AdamW, expandable segments); full AC every 2nd block with one of the two
    flipped; lean at budgets 0.7, 0.5, 0.3."""
    workload, options = WORKLOADS[name]
    policies = axis("block_ac_policy", "full", "op")
    both = (Choice(f"{name}-", AS_WRITTEN), Choice(f"{name}-lean-", LEAN))
    expandable = {"block_ac_every": 2, "cuda_alloc_conf": EXPANDABLE}
    return (
        Block(workload, options=options, each=both, rows=(
            Row("budget-1.0", "grid30"),
            Row("{}-ac-every-{}", "grid30", axes=(policies, every(1, 2, 4))),
        )),
        Block(workload, options=options, each=(Choice(f"{name}-"),), rows=(
            Row("fused-full-ac-every-2", "grid30", {"block_ac_every": 2, **FUSED}),
            Row("expandable-full-ac-every-2", "grid30", expandable),
            Row("lean-budget-{}", "grid30", LEAN, (budgets(0.7, 0.5, 0.3),)),
        )),
    )  # fmt: skip


# Every set `configs` knows, by name. Laid out as a table: ruff's formatter leaves it as written.
# fmt: off
SETS: dict[str, ConfigSet] = {
    "issue2": ConfigSet("budgets 1.0, 0.7, 0.5, 0.0 and block AC every 1 and 2 under compile", (
        Block(LLAMA, (
            Row("budget-{}", "budget", axes=(budgets(1.0, 0.7, 0.5, 0.0),)),
            Row("ac-every-{}", "block-ac", axes=(every(1, 2),)),
        )),
    )),
    "grid": ConfigSet(
        "eager, eager + full AC, budgets 0.0..1.0 every 0.1, block AC every 1/2/4 with the full "
        "and op policies, nosac; the same with fused AdamW", (
        Block(LLAMA, (
            Row("eager", "eager", EAGER),
            Row("eager-ac-every-1", "eager", {**EAGER, "block_ac_every": 1}),
            Row("budget-{}", "budget", axes=(budgets(*TENTHS),)),
            Row("ac-every-{}", "block-ac", axes=(every(1, 2, 4),)),
            Row("op-sac", "op-policy", {"block_ac_every": 1, **OP}),
            Row("nosac", "nosac", NOSAC),
            Row("op-ac-every-{}", "op-policy", OP, (every(2, 4),)),
            Row("fused-op-ac-every-{}", "fused-op-policy", {**OP, **FUSED}, (every(2, 4),)),
            Row("fused-budget-{}", "fused-budget", FUSED, (budgets(*TENTHS),)),
            Row("fused-ac-every-{}", "fused-block-ac", FUSED, (every(1, 2, 4),)),
            Row("fused-op-sac", "fused-op-policy", {"block_ac_every": 1, **OP, **FUSED}),
            Row("fused-nosac", "fused-nosac", {**NOSAC, **FUSED}),
            Row("fused-eager", "fused-eager", {**EAGER, **FUSED}),
        )),
    )),
    "b8": ConfigSet(
        "B=8: budget 1.0 as written; fused at budgets 1.0, 0.7, 0.5, 0.3, 0.2 and full AC", (
        Block(LLAMA, options={"batch_size": 8}, rows=(
            # the user's unconstrained baseline at B=8 (L3's slowdown is against it)
            Row("b8-budget-1.0", "b8-budget"),
            Row("b8-fused-budget-{}", "b8-fused-budget", FUSED,
                (budgets(1.0, 0.7, 0.5, 0.3, 0.2),)),
            Row("b8-fused-ac-every-1", "b8-fused-block-ac", {"block_ac_every": 1, **FUSED}),
        )),
    )),
    "b64": ConfigSet(
        "B=64 (L5): budget 1.0, block AC every 1/2 (both optimizers), fused budgets 0.7..0.1 "
        "with and without expandable segments", (
        # L5: B=64 does not fit at budget 1.0 on an H200; full block AC is the hand pick.
        Block(LLAMA, options={"batch_size": 64}, rows=(
            Row("b64-budget-1.0", "b64-budget"),
            Row("b64-ac-every-{}", "b64-block-ac", {"optimizer_impl": "as_written"},
                (every(1, 2),)),
            Row("b64-fused-ac-every-{}", "b64-fused-block-ac", FUSED, (every(1, 2),)),
            Row("b64-fused-budget-{}{}", "b64-fused-budget", FUSED,
                (budgets(0.7, 0.5, 0.3, 0.2, 0.1), ALLOCATORS)),
        )),
    )),
    "vit": ConfigSet("builtin:vit: budgets 1.0, 0.7, 0.5, full AC, op policy", (
        Block(VIT, (
            Row("vit-budget-{}", "budget", axes=(budgets(1.0, 0.7, 0.5),)),
            Row("vit-ac-every-1", "block-ac", {"block_ac_every": 1}),
            Row("vit-op-sac", "op-policy", {"block_ac_every": 1, **OP}),
        )),
    )),
    "variants": ConfigSet(
        # Which workload definition the pre-project reference measured: tied vs untied LM head,
        # float32 vs bf16 cross entropy (its steady bytes suggest untied).
        "untied LM head with the loss on bf16 and on fp32 logits: budget 1.0, full AC (both "
        "optimizers), fused budget 0.7", (
        Block(LLAMA, each=(
            Choice("untied-bf16loss-", options={"tie_embeddings": False, "fp32_loss": False}),
            Choice("untied-fp32loss-", options={"tie_embeddings": False, "fp32_loss": True}),
        ), rows=(
            Row("budget-1.0", "variant"),
            Row("ac-every-1", "variant", {"block_ac_every": 1}),
            Row("fused-ac-every-1", "variant", {"block_ac_every": 1, **FUSED}),
            Row("fused-budget-0.7", "variant", {"activation_memory_budget": 0.7, **FUSED}),
        )),
    )),
    "smoke": ConfigSet("tiny-gpt on CPU (for tests)", (
        # eager: the tests of this script are about the loop, not the partitioner
        Block(TINY, steps=(1, 1), spec=SMOKE, rows=(
            Row("tiny-budget-1.0", "budget"),
            Row("tiny-budget-0.2", "budget", {"activation_memory_budget": 0.2}),
        )),
    )),
    **{
        f"grid30-{name}": ConfigSet(
            f"issue 30's hand grid of {WORKLOADS[name][0]} (benchmarks/grid_vs_search.py)",
            grid30(name),
        )
        for name in WORKLOADS
    },
}
# fmt: on


def configs(name: str, *, warmup: int, timed: int) -> list[dict[str, Any]]:
    """The configurations of set ``name``, in the order they are measured."""
    if name in SETS:
        return expand(SETS[name].blocks, warmup=warmup, timed=timed)
    if name.startswith("grid30-"):
        raise SystemExit(f"unknown set {name!r}; grid30- sets: {sorted(WORKLOADS)}")
    raise SystemExit(f"unknown set {name!r}")
