"""NVML (nvidia-ml-py, imported as ``pynvml``): what the driver says about GPUs and processes,
without initialising CUDA in the calling process. The one place budgettune opens NVML.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def nvml_session() -> Iterator[Any]:
    """``pynvml``, initialised for the block, or None when it is missing or finds no driver."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def device_count() -> int:
    """Number of NVIDIA GPUs NVML sees (0 if none, or no driver)."""
    with nvml_session() as nvml:
        if nvml is None:
            return 0
        try:
            return int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            return 0


def nvml_index(torch_index: int, visible_devices: str | None) -> int | str:
    """Map a torch CUDA device index to what NVML needs: an index, or a UUID string.

    ``CUDA_VISIBLE_DEVICES`` renumbers devices for torch but not for NVML; entries may be
    indices or ``GPU-...``/``MIG-...`` UUIDs.
    """
    if not visible_devices:
        return torch_index
    entries = [entry.strip() for entry in visible_devices.split(",") if entry.strip()]
    if torch_index >= len(entries):
        raise ValueError(
            f"CUDA device {torch_index} is not among CUDA_VISIBLE_DEVICES={visible_devices!r}"
        )
    entry = entries[torch_index]
    return int(entry) if entry.isdigit() else entry


def process_used_bytes(torch_index: int) -> int | None:
    """This process's memory on the device as NVML reports it, or None when it cannot say
    (no driver, or none per process: some containers, MIG)."""
    with nvml_session() as nvml:
        if nvml is None:
            return None
        try:
            target = nvml_index(torch_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if isinstance(target, int):
                handle = nvml.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(target)
            pid = os.getpid()
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(process, "usedGpuMemory", None)
                if process.pid == pid and isinstance(used, int):
                    return used
            return None
        except (nvml.NVMLError, ValueError):
            return None
