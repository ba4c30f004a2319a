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
    (two children or more) containers anywhere in the tree whose children share one class;
    the one whose children hold the most parameter elements wins (then the longest, then the
    first in `named_modules` order). So
    GPT-2's ``transformer.h``, Llama's ``model.layers``, BERT's ``encoder.layer``, ViT's
    ``encoder.layer`` and a mixture-of-experts model's decoder layers are found, and never an
    experts list inside one layer (it holds a fraction of the layer's parameters).

    Returns:
        The blocks, or an empty list when the model has no such container.
    """
    from torch import nn

    best: list[nn.Module] = []
    best_key = (-1, 0)
    for module in model.modules():
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
        key = (params, len(children))
        if key > best_key:
            best, best_key = children, key
    return best
