"""Finding a model's repeated blocks (what block AC wraps), by parameter structure.

Below `workload` (which fills ``Workload.blocks`` with it) and `trial` (block AC, the pin);
imports torch at call time only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model, found by parameter structure.

    Candidates are the `nn.ModuleList` (a one-layer model has one block) and `nn.Sequential`
    (two children or more) containers anywhere in the tree whose children share one class.
    The one whose children hold the most parameter elements is the main stack (then the
    longest, then the first in `named_modules` order). So GPT-2's ``transformer.h``, Llama's
    ``model.layers``, BERT's and ViT's encoder layers and a mixture-of-experts model's decoder
    layers are found, and never an experts list inside one layer (it holds a fraction of the
    layer's parameters, and it lies inside a block already).

    An encoder-decoder has two stacks (T5's encoder and decoder blocks, BART's encoder and
    decoder layers), as has a two-tower model: every other candidate outside the stacks taken
    so far whose blocks are, on average, at least a quarter of the main stack's block is taken
    too (a list of layer norms is not). Blocks come in model order.

    Returns:
        The blocks, or an empty list when the model has no such container.
    """
    from torch import nn

    candidates = []
    for order, (name, module) in enumerate(model.named_modules()):
        if isinstance(module, nn.ModuleList):
            if len(module) < 1:
                continue
        elif not isinstance(module, nn.Sequential) or len(module) < 2:
            continue
        children = list(module)
        if len({type(child) for child in children}) != 1:
            continue
        # Shared parameters (tied weights) counted once.
        unique = {id(p): p for child in children for p in child.parameters()}
        params = sum(p.numel() for p in unique.values())
        if params:
            candidates.append((params, len(children), order, name, children))
    if not candidates:
        return []
    candidates.sort(key=lambda c: (-c[0], -c[1], c[2]))  # most parameters, longest, first
    per_block = candidates[0][0] / candidates[0][1]
    taken: list[tuple[int, str, list[nn.Module]]] = []
    for params, length, order, name, children in candidates:
        if taken and params / length < per_block / 4:
            continue
        if any(_nested(name, other) or _nested(other, name) for _, other, _ in taken):
            continue
        taken.append((order, name, children))
    return [block for _, _, children in sorted(taken) for block in children]


def _nested(outer: str, inner: str) -> bool:
    """``inner`` is ``outer`` or lies inside it (named_modules paths; the root is "")."""
    return outer == "" or inner == outer or inner.startswith(outer + ".")
