"""The GPUs a process may use, without initialising CUDA in it: ``CUDA_VISIBLE_DEVICES`` and
NVML (nvidia-ml-py, imported as ``pynvml``: what the driver says about GPUs and processes).

The one place budgettune reads ``CUDA_VISIBLE_DEVICES``, parses a device string's GPU indices
or opens NVML.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from budgettune.errors import DeviceUnavailableError

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def visible_entries(visible_devices: str | None) -> list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value (indices or ``GPU-...``/``MIG-...``
    UUIDs), or None when it is unset or blank (every GPU is visible)."""
    if visible_devices is None or not visible_devices.strip():
        return None
    return [entry.strip() for entry in visible_devices.split(",") if entry.strip()]


def device_indices(device: str) -> list[int]:
    """The GPU indices a device names: ``cuda:2`` → [2], ``cuda:0,1`` → [0, 1], ``cuda`` → [0]."""
    if ":" not in device:
        return [0]
    return [int(part) for part in device.split(":", 1)[1].split(",")]


def visible_device_env(device: str) -> tuple[str, dict[str, str]]:
    """Pin a ``cuda:N`` trial to one GPU: the child sees only that GPU, as ``cuda``.

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N`` (N counts the GPUs this process may see).

    Returns:
        The device string for the child and the environment variables to set for it.

    Raises:
        DeviceUnavailableError: N is past what ``CUDA_VISIBLE_DEVICES`` shows.
    """
    if not device.startswith("cuda:"):
        return device, {}
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    entries = visible_entries(visible)
    physical = []
    for index in device_indices(device):
        if entries is None:
            physical.append(str(index))
        elif index < len(entries):
            physical.append(entries[index])
        else:
            raise DeviceUnavailableError(
                f"--device {device}: {VISIBLE_DEVICES_ENV}={visible} shows only "
                f"{len(entries)} GPU(s)"
            )
    return "cuda", {VISIBLE_DEVICES_ENV: ",".join(physical)}


def check_device_available(device: str) -> None:
    """Fail early, in the parent, when a CUDA device is asked for and not present.

    Raises:
        DeviceUnavailableError: ``cuda``/``cuda:N`` on a machine without that GPU.
    """
    if device == "cpu":
        return
    count = cuda_device_count()
    index = max(device_indices(device))
    entries = visible_entries(os.environ.get(VISIBLE_DEVICES_ENV))
    if entries is not None:
        count = min(count, len(entries))
    if count == 0:
        raise DeviceUnavailableError(
            f"--device {device}: no CUDA GPU on this machine (NVML sees none); use --device cpu"
        )
    if index >= count:
        raise DeviceUnavailableError(
            f"--device {device}: this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})"
        )


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


def cuda_device_count() -> int:
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
    entries = visible_entries(visible_devices)
    if entries is None:
        return torch_index
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
            target = nvml_index(torch_index, os.environ.get(VISIBLE_DEVICES_ENV))
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
