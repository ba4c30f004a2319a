"""Activation offload, eager: a block's saved activations moved to host memory in the forward
and brought back when the backward needs them (saved-tensor hooks, as torchao's
``OffloadActivations`` and ``torch.autograd.graph.save_on_cpu`` do).

On CUDA the copy to the host runs on a side stream into pinned memory, so it overlaps the
forward's compute. The device tensor is kept alive until its copy is done (`InFlight`, as
torchao's ``OffloadActivations`` stashes it) and then dropped on the compute stream, so the
caching allocator reuses its memory at once. ``Tensor.record_stream`` would keep the memory
from every allocation until the allocator sees the copy's event complete: on an H200 (torch
2.11, Llama-1B shape at B=32) it raised the device peak above no offload at all while the
allocated peak fell by 36 % (benchmarks/results/offload33). At most ``max_in_flight``
copies run at once; past that the compute stream waits for the oldest, so the forward runs at
the copy engine's pace rather than filling the device with tensors waiting to leave. The copy
back is issued on the compute stream after the transfer's event, non-blocking from pinned
memory. The host copy has the device tensor's strides (inductor's backward checks the strides
of what it saved), so only tensors that are non-overlapping and dense move; a view into a
larger tensor (attention's q, k, v of one projection) stays, as do parameters, views of them,
the model's own tensors (`ActivationOffload.keep`: its parameters and buffers) and tensors
under ``min_bytes``. A `HostLedger` counts the host bytes held, for the trial's host-memory
peak (host memory is finite too, and the ranks of a host share it).

torch is imported at call time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError

if TYPE_CHECKING:
    import torch
    from torch import nn

_OFFLOAD_MARK = "_budgettune_offload"
DEFAULT_MIN_BYTES = 1 << 20
"""Tensors under 1 MiB stay on the device: their transfer costs more than it saves."""


@dataclass
class HostLedger:
    """Host bytes held by offloaded activations: now, and the most at once."""

    held_bytes: int = 0
    peak_bytes: int = 0
    moved_bytes: int = 0
    """Bytes copied to the host (each comes back once, in the backward)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def hold(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes += nbytes
            self.moved_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes -= nbytes

    def reset_peak(self) -> None:
        """Start a new peak (and byte count) from what is held now: one step's figures."""
        with self._lock:
            self.peak_bytes = self.held_bytes
            self.moved_bytes = 0


DEFAULT_MAX_IN_FLIGHT = 5
"""Copies to the host in flight at once (torchao's ``max_fwd_stash_size``)."""


class InFlight:
    """Device tensors whose copy to the host has not been seen to finish, oldest first.

    A tensor is dropped (its memory goes back to the allocator on the compute stream) once its
    copy's event has completed, or, past ``limit`` entries, after ``wait(event)`` has made the
    compute stream wait for the copy: what the compute stream does next is ordered after it,
    so the memory is safe to reuse.
    """

    def __init__(self, limit: int, wait: Callable[[Any], None]) -> None:
        if limit < 1:
            raise SpecError(f"max_in_flight must be >= 1, got {limit}")
        self.limit = limit
        self._wait = wait
        self._entries: list[tuple[Any, Any]] = []  # (device tensor, its copy's event)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, tensor: Any, event: Any) -> None:
        """Hold ``tensor`` until ``event`` (its copy) is done; keep at most ``limit``."""
        self.drop_done()
        while len(self._entries) >= self.limit:
            _, oldest = self._entries.pop(0)
            self._wait(oldest)
        self._entries.append((tensor, event))

    def drop_done(self) -> None:
        """Drop, oldest first, the tensors whose copies have finished."""
        while self._entries and self._entries[0][1].query():
            self._entries.pop(0)

    def settle(self) -> None:
        """Order the compute stream after every copy still in flight and drop them all."""
        while self._entries:
            _, event = self._entries.pop(0)
            self._wait(event)


@dataclass(frozen=True)
class _Offloaded:
    host: torch.Tensor
    device: torch.device
    event: Any  # a torch.cuda.Event, or None when the copy was synchronous


class ActivationOffload:
    """Saved-tensor hooks that keep a region's activations in host memory.

    Use as a context manager around the forward of the region (`apply_block_offload` wraps
    blocks so). ``device_types`` names the devices whose tensors are moved (``("cuda",)``;
    the tests move CPU tensors to show the bookkeeping without a GPU).
    """

    def __init__(
        self,
        ledger: HostLedger | None = None,
        *,
        min_bytes: int = DEFAULT_MIN_BYTES,
        pin_memory: bool = True,
        device_types: Sequence[str] = ("cuda",),
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.ledger = ledger if ledger is not None else HostLedger()
        self.min_bytes = min_bytes
        self.pin_memory = pin_memory
        self.device_types = tuple(device_types)
        self._streams: dict[Any, Any] = {}
        self._entered: list[Any] = []  # one hooks context per entry: entries may nest
        self._kept: set[int] = set()
        self.in_flight = InFlight(max_in_flight, _compute_stream_waits)

    def keep(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never move these (the model's parameters and buffers: a RoPE table saved by every
        block would otherwise be copied out once per block), nor any view of their memory."""
        self._kept |= {t.untyped_storage().data_ptr() for t in tensors}

    def __enter__(self) -> ActivationOffload:
        import torch

        hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        hooks.__enter__()
        self._entered.append(hooks)
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered.pop().__exit__(*exc)
        self.in_flight.drop_done()

    def wants(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is an activation worth moving."""
        import torch

        if tensor.device.type not in self.device_types or tensor.is_sparse:
            return False
        base = tensor._base if tensor._base is not None else tensor  # weight.t() is a view
        if isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad):
            return False  # a weight: it stays on the device whatever is saved
        if tensor.numel() * tensor.element_size() < self.min_bytes or not _dense(tensor):
            return False
        return tensor.untyped_storage().data_ptr() not in self._kept

    def pack(self, tensor: torch.Tensor) -> Any:
        import torch

        if not self.wants(tensor):
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        pin = self.pin_memory and tensor.device.type == "cuda"
        host = torch.empty_strided(
            tensor.size(), tensor.stride(), dtype=tensor.dtype, pin_memory=pin
        )  # the same strides: what comes back is what was saved
        event = None
        if tensor.device.type == "cuda":
            stream = self._side_stream(tensor.device)
            stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                host.copy_(tensor, non_blocking=pin)
                event = torch.cuda.Event()
                event.record(stream)
            self.in_flight.add(tensor, event)  # alive until the copy is done
        else:
            host.copy_(tensor)
        self.ledger.hold(nbytes)
        weakref.finalize(host, self.ledger.release, nbytes)
        return _Offloaded(host=host, device=tensor.device, event=event)

    def unpack(self, packed: Any) -> torch.Tensor:
        import torch

        if not isinstance(packed, _Offloaded):
            return packed
        if packed.event is not None:
            self.in_flight.settle()  # the backward has begun: the forward's copies are done
            torch.cuda.current_stream(packed.device).wait_event(packed.event)
            return packed.host.to(packed.device, non_blocking=packed.host.is_pinned())
        return packed.host.to(packed.device, copy=True)

    def _side_stream(self, device: torch.device) -> Any:
        import torch

        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]


def _compute_stream_waits(event: Any) -> None:
    """Make the current (compute) stream wait for ``event``; the host does not block."""
    import torch

    torch.cuda.current_stream().wait_event(event)


def _dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill its memory exactly once, in some dimension order
    (a host buffer of its strides then holds it and nothing else)."""
    expected = 1
    for size, stride in sorted(
        zip(tensor.size(), tensor.stride(), strict=True), key=lambda p: p[1]
    ):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def apply_block_offload(
    blocks: Sequence[nn.Module],
    every: int,
    offload: ActivationOffload,
    *,
    skip: Callable[[nn.Module], bool] = lambda block: False,
) -> int:
    """Run every ``every``-th block's forward (1-based positions ``every, 2*every, ...``, as
    block AC counts) under ``offload``, in place: the block's instance ``forward`` is wrapped,
    the module tree and state_dict keys do not change.

    Args:
        blocks: the repeated blocks, in model order.
        every: 0 = off; k = every k-th block.
        offload: the hooks (one instance for all blocks: one ledger, one side stream).
        skip: blocks left alone (a block under full block AC saves nothing to offload).

    Returns:
        The number of blocks wrapped.

    Raises:
        SpecError: on a negative stride or a block already wrapped.
    """
    if every < 0:
        raise SpecError(f"offload_every must be >= 0, got {every}")
    wrapped = 0
    for position, block in enumerate(blocks, start=1):
        if not every or position % every or skip(block):
            continue
        if getattr(block, _OFFLOAD_MARK, False):
            raise SpecError(f"block {position - 1} ({type(block).__name__}) is already offloaded")
        block.forward = _offloaded(block.forward, offload)  # type: ignore[method-assign]
        setattr(block, _OFFLOAD_MARK, True)
        wrapped += 1
    return wrapped


def _offloaded(inner: Callable[..., Any], offload: ActivationOffload) -> Callable[..., Any]:
    def offloaded_forward(*args: Any, **kwargs: Any) -> Any:
        with offload:
            return inner(*args, **kwargs)

    return offloaded_forward


def is_offloaded(block: nn.Module) -> bool:
    """Whether `apply_block_offload` wrapped ``block``."""
    return bool(getattr(block, _OFFLOAD_MARK, False))


def compiled_offload_settings() -> dict[str, bool]:
    """Which of the partitioner's offload settings this torch has, by feature, not version
    (issue 33 read torch 2.11 on an H200 host: all but ``activation_offload_cpu_gpu_bw``;
    torch 2.13 here has all five)."""
    import torch._functorch.config as functorch_config

    return {
        name: hasattr(functorch_config, name)
        for name in (
            "enable_activation_offloading",
            "activation_offload_separate_stream",
            "activation_offload_sink_wait",
            "activation_reload_prefetch",
            "activation_offload_cpu_gpu_bw",
        )
    }
