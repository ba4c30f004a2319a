"""Hugging Face `transformers` models under block AC: the KV cache goes off.

A `transformers` model runs with ``config.use_cache=True`` by default, so recomputing a block
in backward appends its keys and values to the cache a second time: full AC then fails on a
shape (``The expanded size of the tensor (2048) must match the existing size (1024)``) and the
op policy on a replay that differs from the forward (``aten.slice.Tensor encountered during
backward but not found in storage``: the recompute reads a cache the forward already grew).
`transformers` turns the cache off itself when its own gradient checkpointing is on; block AC
does the same, here. A training step never needs the cache. `transformers` is never imported
here: a model is recognised only if the user's process has imported it already.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

USE_CACHE_OFF = "use_cache=False"
"""The model change recorded in the trial result and the pin."""


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a `transformers.PreTrainedModel` (without importing transformers)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    base = getattr(transformers, "PreTrainedModel", None)
    return isinstance(base, type) and isinstance(model, base)


def _configs(model: nn.Module) -> list[Any]:
    """Every config of the model and its submodules, and their text sub-configs, once each."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "to_dict"):
            continue
        found.setdefault(id(config), config)
        get_text_config = getattr(config, "get_text_config", None)
        if callable(get_text_config):
            text = get_text_config()
            if text is not None:
                found.setdefault(id(text), text)
    return list(found.values())


def disable_cache_for_block_ac(model: nn.Module) -> tuple[str, ...]:
    """Turn the KV cache off on a `transformers` model before block AC wraps its blocks.

    Sets ``use_cache = False`` on the model's config and on every submodule's config that has
    the attribute, as `transformers` does under its own gradient checkpointing.

    Returns:
        ``("use_cache=False",)`` when a config had the cache on, else ``()`` (not a
        `transformers` model, or its cache was off already).
    """
    if not is_transformers_model(model):
        return ()
    changed = False
    for config in _configs(model):
        if getattr(config, "use_cache", False):
            config.use_cache = False
            changed = True
    if not changed:
        return ()
    log.info(
        "block AC on a transformers %s: set config.use_cache=False (as transformers does "
        "under gradient checkpointing: a recomputed block would append to the KV cache twice)",
        type(model).__name__,
    )
    return (USE_CACHE_OFF,)
