"""Hugging Face `transformers` models under block AC or per-block compile: the KV cache goes off.

A `transformers` model runs with ``config.use_cache=True`` by default, so in a training step it
builds a KV cache that nothing reads, and:

- recomputing a block in backward appends its keys and values to the cache a second time: full
  AC then fails on a shape (``The expanded size of the tensor (2048) must match the existing
  size (1024)``) and the op policy on a replay that differs from the forward
  (``aten.slice.Tensor encountered during backward but not found in storage``);
- compiling each block on its own (sharded trials, torchtitan's order) recompiles for every
  layer, since dynamo guards on the cache's per-layer state (``cache.layers[i].is_initialized``)
  and a 28-layer decoder hits the recompile limit (8) under ``fullgraph=True``
  (``FailOnRecompileLimitHit``); with the cache off, one graph serves every layer (seen on
  transformers 4.57.6, 5.17.0 and 5.24.0 for Qwen2, Llama, GPT-2, Mistral, Gemma 2/3).

`transformers` turns the cache off itself when its own gradient checkpointing is on; budgettune
does the same, on every `transformers` model inside the user's module, at any depth (a model held
by the user's wrapper, or by an adapter library's). The change is recorded in the trial result
and the pin (`USE_CACHE_OFF`), and `apply_model_changes` makes it again in the job.
`transformers` is never imported here: a model is recognised only if the process imported it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

USE_CACHE_OFF = "use_cache=False"
"""The model change recorded in the trial result and the pin."""
KNOWN_MODEL_CHANGES = (USE_CACHE_OFF,)
"""Every model change a trial can record, each of which `apply_model_changes` can make."""


def transformers_models(model: nn.Module) -> list[nn.Module]:
    """Every `transformers.PreTrainedModel` in ``model``'s tree, itself included, outermost
    first (none when the process has not imported `transformers`)."""
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None) if transformers else None
    if not isinstance(base, type):
        return []
    return [module for module in model.modules() if isinstance(module, base)]


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is, or holds at any depth, a `transformers.PreTrainedModel`."""
    return bool(transformers_models(model))


def _configs(models: Sequence[nn.Module]) -> list[Any]:
    """Every config of the models and their submodules, and their text sub-configs, once each."""
    found: dict[int, Any] = {}
    for model in models:
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


def turn_off_kv_cache(model: nn.Module) -> tuple[str, ...]:
    """Turn the KV cache off on every `transformers` model inside ``model``.

    Sets ``use_cache = False`` on each such model's config and on every submodule's config that
    has the attribute, as `transformers` does under its own gradient checkpointing.

    Returns:
        ``("use_cache=False",)`` when a config had the cache on, else ``()`` (no
        `transformers` model, or its cache was off already).
    """
    models = transformers_models(model)
    changed = False
    for config in _configs(models):
        if getattr(config, "use_cache", False):
            config.use_cache = False
            changed = True
    if not changed:
        return ()
    log.info(
        "%s holds transformers %s: set config.use_cache=False (as transformers does under "
        "gradient checkpointing: a recomputed or separately compiled block must not grow a "
        "KV cache)",
        type(model).__name__,
        ", ".join(sorted({type(m).__name__ for m in models})),
    )
    return (USE_CACHE_OFF,)


def check_model_changes(changes: Sequence[str]) -> None:
    """Refuse model changes this budgettune cannot make (a pin's, read or applied).

    Raises:
        SpecError: naming them (the first 200 characters) and what to do.
    """
    unknown = sorted(set(changes) - set(KNOWN_MODEL_CHANGES))
    if unknown:
        raise SpecError(
            "the pin records model changes this budgettune cannot make: "
            f"{', '.join(unknown)[:200]}; upgrade budgettune"
        )


def apply_model_changes(model: nn.Module, changes: Sequence[str]) -> tuple[str, ...]:
    """Make the model changes a trial recorded (a pin's ``model_changes``) on the job's model.

    Returns:
        The changes that changed something here.

    Raises:
        SpecError: a change this budgettune does not know (a pin from a newer one).
    """
    check_model_changes(changes)
    made: tuple[str, ...] = ()
    if USE_CACHE_OFF in changes:
        made += turn_off_kv_cache(model)
    return made
