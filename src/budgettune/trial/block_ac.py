"""Classic per-block activation checkpointing: full, or torchtitan's selective "op" policy.

The block's instance ``forward`` is wrapped in non-reentrant `torch.utils.checkpoint`, so the
module tree and state_dict keys do not change; torch is imported at call time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError

if TYPE_CHECKING:
    from torch import nn

_BLOCK_AC_MARK = "_budgettune_block_ac"


def _torchtitan_op_policy() -> Callable[..., Any]:
    """torchtitan's selective-AC "op" policy: save matmul/attention/max/reduce-scatter outputs,
    recompute the rest, and recompute every second mm (counted per checkpointed block call)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = {aten.mm.default, aten.max.default}
    for name in (
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        packet = getattr(aten, name, None)
        if packet is not None:
            save.add(packet.default)
    c10d = getattr(torch.ops, "_c10d_functional", None)
    reduce_scatter = getattr(c10d, "reduce_scatter_tensor", None) if c10d else None
    if reduce_scatter is not None:
        save.add(reduce_scatter.default)
    mm_counts: defaultdict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == aten.mm.default:
            mm_counts[key] += 1
        to_save = func in save and not (func == aten.mm.default and mm_counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_policy_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    # A fresh counter per checkpointed call, like torchtitan (its `meta` dict per context).
    return create_selective_checkpoint_contexts(_torchtitan_op_policy())


def _full_checkpointed(inner: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    return checkpointed_forward


def _op_checkpointed(inner: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        # context_fn must be a plain function dynamo can see (not a closure cell holding
        # noop_context_fn: dynamo 2.13 raises "checkpoint not implemented for
        # LazyVariableTracker context_fn" on that).
        return checkpoint(
            inner, *args, use_reentrant=False, context_fn=_op_policy_context, **kwargs
        )

    return checkpointed_forward


def apply_block_ac(blocks: Sequence[nn.Module], every: int, policy: str) -> int:
    """Wrap every ``every``-th block in non-reentrant `torch.utils.checkpoint`, in place.

    Like torchtitan's ``ac_freq``, the blocks at 1-based positions ``every, 2*every, ...`` are
    wrapped (every=1: all; every=2: the 2nd, 4th, ...). The block's instance ``forward`` is
    replaced, so the module tree and state_dict keys do not change; it works eagerly and under
    `torch.compile` (dynamo turns the checkpoint into its tag_activation_checkpoint op).

    Args:
        blocks: the repeated blocks, in model order.
        every: 0 = off; k = wrap every k-th block.
        policy: ``full`` (recompute the whole block) or ``op`` (torchtitan's selective policy).

    Returns:
        The number of blocks wrapped.

    Raises:
        SpecError: on an unknown policy or a block already wrapped.
    """
    if policy not in ("full", "op"):
        raise SpecError(f"unknown block_ac_policy {policy!r}; choose one of: full, op")
    if every < 0:
        raise SpecError(f"block_ac_every must be >= 0, got {every}")
    if every == 0:
        return 0
    wrapped = 0
    for position, block in enumerate(blocks, start=1):
        if position % every:
            continue
        if getattr(block, _BLOCK_AC_MARK, False):
            raise SpecError(f"block {position - 1} ({type(block).__name__}) is already wrapped")
        wrap = _op_checkpointed if policy == "op" else _full_checkpointed
        block.forward = wrap(block.forward)  # type: ignore[method-assign]
        setattr(block, _BLOCK_AC_MARK, True)
        wrapped += 1
    return wrapped


def is_checkpointed(block: nn.Module) -> bool:
    """Whether `apply_block_ac` wrapped ``block``."""
    return bool(getattr(block, _BLOCK_AC_MARK, False))
