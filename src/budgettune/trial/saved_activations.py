"""What a prepared step saves for its backward, counted (tests and benchmarks compare settings
by it; a trial measures memory instead, in `measure`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from budgettune.trial.recompute import PreparedStep


def saved_activation_stats(step: PreparedStep) -> tuple[int, int]:
    """Count the activations one forward saves for backward: (tensors, bytes).

    Uses `saved_tensors_hooks` (a TorchDispatchMode would make compiled code run eagerly);
    compiled graphs save through ``ctx.save_for_backward`` so the hooks see them. Tensors are
    deduplicated by storage, and storages of parameters, buffers and the batch are left out.
    Runs one forward+loss and one backward (so a lazily compiled backward compiles too); the
    gradients are then dropped.
    """
    import torch
    import torch.utils._pytree as pytree

    excluded = {
        t.untyped_storage().data_ptr() for t in [*step.model.parameters(), *step.model.buffers()]
    }
    excluded |= {
        leaf.untyped_storage().data_ptr()
        for leaf in pytree.tree_leaves(step.batch)
        if isinstance(leaf, torch.Tensor)
    }
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step.forward_loss()
    step.backward(loss)
    step.optimizer.zero_grad(set_to_none=True)
    return len(saved), sum(saved.values())
