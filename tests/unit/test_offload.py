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


class _Event:
    """A copy's event as `InFlight` sees it: done or not."""

    def __init__(self, done: bool = False) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def test_in_flight_drops_a_device_tensor_only_once_its_copy_is_done_or_waited_for() -> None:
    """The device copy of an offloaded tensor stays alive while its transfer may still read it,
    and no longer: a finished copy lets it go at the next offload; past the limit the compute
    stream waits for the oldest copy (never the host) and it goes; the backward settles all."""
    from budgettune.trial.offload import InFlight

    waited: list[_Event] = []
    in_flight = InFlight(2, waited.append)
    first, second, third = _Event(), _Event(), _Event()
    in_flight.add("t1", first)
    in_flight.add("t2", second)
    assert len(in_flight) == 2 and waited == []
    in_flight.add("t3", third)  # over the limit: the oldest copy is waited for, then dropped
    assert waited == [first] and len(in_flight) == 2
    second.done = True
    in_flight.drop_done()
    assert len(in_flight) == 1 and waited == [first]  # done: dropped without a wait
    in_flight.settle()
    assert waited == [first, third] and len(in_flight) == 0
    with pytest.raises(SpecError, match="max_in_flight"):
        InFlight(0, waited.append)


def test_offload_no_longer_uses_record_stream() -> None:
    """record_stream kept offloaded memory from reuse until the allocator saw the copy end: on
    an H200 it raised the device peak above no offload at all (benchmarks/results/offload33).
    The hooks keep the tensor in `InFlight` instead."""
    import inspect

    from budgettune.trial import offload

    assert "record_stream(" not in inspect.getsource(offload.ActivationOffload.pack)
    assert "in_flight.add(" in inspect.getsource(offload.ActivationOffload.pack)
