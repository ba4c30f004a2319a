"""Blocks compiled one by one: the sharded path's ``torch.compile(block, fullgraph=True)`` in
place of each block (torchtitan's order), and `compile_forwards`, which compiles each block's
forward in place (the module tree and state_dict keys unchanged) so that something can sit
around each compiled call: activation offload's saved-tensor hooks (`trial.offload`).

torch is imported at call time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)


def _parents(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    return {
        id(child): (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
    }


def allow_recompiles(count: int) -> None:
    """Let dynamo compile one frame ``count`` times before it gives up.

    The blocks compiled one by one share their class's ``forward`` code, so dynamo keeps one
    cache entry list for all of them; blocks that differ in a guarded attribute (a sliding
    window on every other layer) each add an entry, and past the recompile limit (8) a
    ``fullgraph=True`` compile fails (``FailOnRecompileLimitHit``). A limit as large as the
    number of blocks can never be hit that way. Only ever raised, never lowered.
    """
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # the newer name first
        current = getattr(dynamo_config, name, None)
        if isinstance(current, int):
            if current < count:
                setattr(dynamo_config, name, count)
                logger.info("dynamo %s raised from %d to %d (one per block)", name, current, count)
            return


def compile_blocks(
    model: nn.Module, blocks: Sequence[nn.Module], spec: TrialSpec
) -> list[nn.Module]:
    """Replace each block in its parent by ``torch.compile(block, fullgraph=True)``.

    Returns:
        The blocks as they now sit in the model (the compiled wrappers).
    """
    import torch

    if not spec.is_compiled:
        return list(blocks)
    allow_recompiles(len(blocks))
    parents = _parents(model)
    kwargs = _compile_kwargs(spec)
    placed = []
    for block in blocks:
        if id(block) not in parents:
            raise SpecError(f"block {type(block).__name__} is not a submodule of the model")
        parent, name = parents[id(block)]
        compiled = torch.compile(block, **kwargs)
        parent.register_module(name, compiled)  # type: ignore[arg-type]
        placed.append(compiled)
    return placed  # type: ignore[return-value]


def _compile_kwargs(spec: TrialSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"backend": spec.compile_backend, "fullgraph": True}
    if spec.compile_backend == "inductor" and spec.compile_mode != "default":
        kwargs["mode"] = spec.compile_mode
    return kwargs


def compile_forwards(blocks: Sequence[nn.Module], spec: TrialSpec) -> None:
    """Compile each block's ``forward`` in place (the spec's backend and mode; graph breaks
    allowed, as in the whole-model compile it replaces): the block stays the same module, so
    its parent, the state_dict keys and any wrapper of ``block.forward`` set afterwards stay
    outside the compiled region. ``eager``: nothing.

    Call it after block AC (the checkpoint wrapper is compiled with the block).
    """
    import torch

    if not spec.is_compiled:
        return
    allow_recompiles(len(blocks))
    kwargs = {**_compile_kwargs(spec), "fullgraph": False}
    for block in blocks:
        block.forward = torch.compile(block.forward, **kwargs)  # type: ignore[method-assign]
