"""Classic per-block activation checkpointing: full, or torchtitan's selective "op" policy
(its ``SelectiveAC`` at `TORCHTITAN_COMMIT`; which figures were measured with the older one:
benchmarks/results/README.md#op-policy-version), or "op_offload": the op policy, and what it
saves moved to host memory by the partitioner's activation offloading (compiled only: the
marking is `partitioner.mark_saved_for_offload`).

The block's instance ``forward`` is wrapped in non-reentrant `torch.utils.checkpoint`, so the
module tree and state_dict keys do not change; torch is imported at call time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError

if TYPE_CHECKING:
    from torch import nn

_BLOCK_AC_MARK = "_budgettune_block_ac"


TORCHTITAN_COMMIT = "c5d93d1098fe5f6f9b4fe6870b4e3d590ffa9cdf"
"""The torchtitan commit whose ``SelectiveAC`` the "op" policy follows: "Refactor activation
checkpointing into a policy class hierarchy" (#3674, 2026-06-15), still current at b5bcd76
(2026-08-21), in ``torchtitan/distributed/activation_checkpoint.py``."""

_TORCHTITAN_SAVE_OPS: tuple[tuple[str, str], ...] = (
    # compute: SDPA variants, max (the absmax of low-precision scaling), flex attention,
    # linear, topk (kept stable between forward and recompute), compiled regions, varlen
    ("aten", "_scaled_dot_product_cudnn_attention.default"),
    ("aten", "_scaled_dot_product_attention_math.default"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable.default"),
    ("aten", "max.default"),
    ("higher_order", "flex_attention"),
    ("aten", "linear.default"),
    ("aten", "topk.default"),
    ("higher_order", "inductor_compiled_code"),
    ("ops", "torch_attn._varlen_attn.default"),
    # communication: saved so the recompute does not communicate again
    ("ops", "_c10d_functional.reduce_scatter_tensor.default"),
    ("ops", "_c10d_functional.all_to_all_single.default"),
    ("ops", "deepep.dispatch.default"),
    ("ops", "deepep.combine.default"),
    ("ops", "hybridep.dispatch.default"),
    ("ops", "hybridep.combine.default"),
    # not torchtitan's: the CPU kernel of the attention it saves on GPU (CPU trials alike)
    ("aten", "_scaled_dot_product_flash_attention_for_cpu.default"),
)
"""torchtitan's ``_get_default_save_ops`` beyond the partitioner's compute-intensive ops, as
(root, dotted path); an op this torch (or its extensions) lacks is skipped, as there."""


def torchtitan_save_ops() -> set[Any]:
    """The ops whose outputs torchtitan's ``SelectiveAC`` saves (`TORCHTITAN_COMMIT`): the
    partitioner's compute-intensive ops (mm, addmm, bmm, attention, convolution, ...) and
    `_TORCHTITAN_SAVE_OPS` that exist here."""
    import torch
    from torch._functorch.partitioners import get_default_op_list

    roots: dict[str, Any] = {
        "aten": torch.ops.aten,
        "ops": torch.ops,
        "higher_order": torch._higher_order_ops,
    }
    intensive: Iterable[Any] = get_default_op_list().compute_intensive_ops
    save: set[Any] = {op.default for op in intensive}
    for root, path in _TORCHTITAN_SAVE_OPS:
        obj = roots[root]
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):  # not registered in this torch
            continue
        save.add(obj)
    return save


def _torchtitan_op_policy() -> Callable[..., Any]:
    """torchtitan's ``SelectiveAC`` policy (`TORCHTITAN_COMMIT`): save `torchtitan_save_ops`
    and a CUDA-to-CPU copy's result, recompute the rest, and recompute every second mm or
    linear (counted per checkpointed block call, forward and recompute apart).

    One change (issue 45): ``topk`` is recomputed, not saved. A mixture of experts' router
    in transformers normalises its top-k weights in place (``w /= w.sum(...)``: Mixtral,
    DeepSeek-V3 and dozens more), and a saved output written in place fails the backward
    (``Tensor cached during selective activation checkpoint has been mutated``); replaying
    the written tensor instead gave the router's gate a gradient 46 % off (the recomputed sum
    read the normalised weights). Recomputed from the same inputs, ``topk`` selects the
    same experts; torchtitan's own router divides out of place.

    Not followed: ``force_recompute_mm_shapes_by_fqns`` (its default names torchtitan's own
    MoE router gates, ``moe.router.gate``; no other model has them) and disabling dynamo's LRU
    cache (a workaround for pipeline parallelism with flex attention).
    """
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = torchtitan_save_ops()
    mm_ops = (aten.mm.default, aten.linear.default)
    mm_counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if (
            func == aten._to_copy.default
            and "cuda" in str(args[0].device)
            and str(kwargs.get("device")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE  # a device-to-host sync is not repeated
        if func == aten.topk.default:
            return CheckpointPolicy.PREFER_RECOMPUTE  # see above: routers write into it
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            mm_counts[mode] += 1
        if func in save and not (func in mm_ops and mm_counts[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

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


_WRAPS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "full": _full_checkpointed,
    "op": _op_checkpointed,
    "op_offload": _op_checkpointed,  # the same policy; `partitioner` moves what it saves
}


def apply_block_ac(blocks: Sequence[nn.Module], every: int, policy: str) -> int:
    """Wrap every ``every``-th block in non-reentrant `torch.utils.checkpoint`, in place.

    Like torchtitan's ``ac_freq``, the blocks at 1-based positions ``every, 2*every, ...`` are
    wrapped (every=1: all; every=2: the 2nd, 4th, ...). The block's instance ``forward`` is
    replaced, so the module tree and state_dict keys do not change; it works eagerly and under
    `torch.compile` (dynamo turns the checkpoint into its tag_activation_checkpoint op).

    Args:
        blocks: the repeated blocks, in model order.
        every: 0 = off; k = wrap every k-th block.
        policy: ``full`` (recompute the whole block), ``op`` (torchtitan's selective policy)
            or ``op_offload`` (what ``op`` saves goes to host memory: compiled only).

    Returns:
        The number of blocks wrapped.

    Raises:
        SpecError: on an unknown policy or a block already wrapped.
    """
    if policy not in _WRAPS:
        raise SpecError(f"unknown block_ac_policy {policy!r}; choose one of: {', '.join(_WRAPS)}")
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
        block.forward = _WRAPS[policy](block.forward)  # type: ignore[method-assign]
        setattr(block, _BLOCK_AC_MARK, True)
        wrapped += 1
    return wrapped


def is_checkpointed(block: nn.Module) -> bool:
    """Whether `apply_block_ac` wrapped ``block``."""
    return bool(getattr(block, _BLOCK_AC_MARK, False))
