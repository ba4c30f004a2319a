"""Issue 33's eager offload on CPU tensors: the hooks move what a block saves and bring it
back unchanged, leave weights and small tensors alone, count the host bytes, and wrap every
k-th block as block AC counts. (On a GPU the move goes to pinned memory on a side stream.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from budgettune.errors import SpecError
from budgettune.trial.offload import (
    ActivationOffload,
    HostLedger,
    apply_block_offload,
    compiled_offload_settings,
    is_offloaded,
)


def _blocks(n: int = 4, width: int = 32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(n)))


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def _on_cpu(ledger: HostLedger | None = None, min_bytes: int = 0) -> ActivationOffload:
    return ActivationOffload(ledger, min_bytes=min_bytes, device_types=("cpu",))


def test_offloaded_blocks_give_the_same_gradients_and_count_what_they_moved() -> None:
    x = torch.randn(8, 32)
    plain = _grads(_blocks(), x)
    model = _blocks()
    offload = _on_cpu()
    assert apply_block_offload(list(model), 1, offload) == 4
    got = _grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    # each block saves the Linear's input and the GELU's input, 8x32 fp32 each; never a weight
    assert offload.ledger.moved_bytes == 4 * 2 * 8 * 32 * 4
    assert offload.ledger.peak_bytes == offload.ledger.moved_bytes  # all held before backward
    assert offload.ledger.held_bytes == 0  # freed once the backward used them


def test_weights_and_small_tensors_stay_where_they_are() -> None:
    offload = _on_cpu(min_bytes=2048)
    weight = nn.Parameter(torch.randn(64, 64))
    small, big = torch.randn(8), torch.randn(1024)
    assert not offload.wants(weight) and not offload.wants(small) and offload.wants(big)
    assert not offload.wants(weight.t())  # what a Linear saves of its weight: a view of it
    leaf = torch.randn(1024, requires_grad=True)
    assert not offload.wants(leaf)  # a leaf of the model's own: not an activation
    assert offload.pack(small) is small and offload.unpack(small) is small
    packed = offload.pack(big)
    assert packed is not big and torch.equal(offload.unpack(packed), big)
    cuda_only = ActivationOffload(min_bytes=0)  # the default: CUDA tensors only
    assert not cuda_only.wants(big)


def test_a_compiled_block_under_the_hooks_has_its_saved_tensors_moved() -> None:
    # hooks around a compiled block: AOTAutograd's saved activations pass through them (the
    # per-block compile a trial would use with offload)
    x = torch.randn(8, 32)
    plain = _grads(_blocks(2), x)
    model = _blocks(2)
    for block in model:
        block.forward = torch.compile(block.forward, backend="aot_eager")  # type: ignore[method-assign]
    offload = _on_cpu()
    apply_block_offload(list(model), 1, offload)
    got = _grads(model, x)
    assert all(torch.allclose(a, b) for a, b in zip(plain, got, strict=True))
    assert offload.ledger.moved_bytes > 0 and offload.ledger.held_bytes == 0


def test_every_kth_block_as_block_ac_counts_and_refusals() -> None:
    model = _blocks(5)
    blocks = list(model)
    assert apply_block_offload(blocks, 2, _on_cpu(), skip=lambda b: b is blocks[3]) == 1
    assert [is_offloaded(b) for b in blocks] == [False, True, False, False, False]
    with pytest.raises(SpecError, match="already offloaded"):
        apply_block_offload(blocks, 1, _on_cpu())
    with pytest.raises(SpecError, match="offload_every must be >= 0"):
        apply_block_offload(list(_blocks(1)), -1, _on_cpu())
    assert apply_block_offload(list(_blocks(2)), 0, _on_cpu()) == 0


def test_the_ledger_peak_restarts_from_what_is_held() -> None:
    ledger = HostLedger()
    ledger.hold(100)
    ledger.hold(50)
    ledger.release(100)
    assert (ledger.held_bytes, ledger.peak_bytes, ledger.moved_bytes) == (50, 150, 150)
    ledger.reset_peak()
    assert (ledger.peak_bytes, ledger.moved_bytes) == (50, 0)


def test_compiled_offload_settings_are_found_by_feature() -> None:
    found = compiled_offload_settings()
    assert found["enable_activation_offloading"] is True  # torch 2.13 on this machine
    assert set(found) >= {"activation_reload_prefetch", "activation_offload_cpu_gpu_bw"}
