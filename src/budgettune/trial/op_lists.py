"""The partitioner's recomputable-op list as knobs see it: op names, and the search's candidates.

Names are checked for syntax here; whether an op exists in this torch is checked by
`recompute.resolve_ops` in the child, the only place torch is imported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from budgettune.errors import SpecError

OP_NAME_PATTERN = re.compile(r"^(aten|prims)\.[A-Za-z_][A-Za-z0-9_]*$")
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
"""Cheap ops worth taking out of the recomputable list (the "nosac" trick removes aten.add)."""
DEFAULT_ADDABLE_OPS_CUDA = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
)
"""Compute-intensive ops worth putting into it (benchmarks/results/README.md#addable-ops)."""
DEFAULT_ADDABLE_OPS_CPU = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten._scaled_dot_product_flash_attention_for_cpu",
)


def check_op_names(name: str, ops: Iterable[str]) -> tuple[str, ...]:
    """The op names, sorted and without repeats.

    Raises:
        SpecError: a name that is not ``aten.NAME`` or ``prims.NAME``, naming the knob.
    """
    ops = tuple(ops)
    for op in ops:
        if not isinstance(op, str) or not OP_NAME_PATTERN.fullmatch(op):
            raise SpecError(f"{name}: {op!r} is not an op name; write it like aten.add or aten.mm")
    return tuple(sorted(set(ops)))
