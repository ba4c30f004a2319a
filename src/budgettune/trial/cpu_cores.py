"""CPU cores by GPU: a search over several GPUs gives each GPU (or sharded group) its own share
of the cores this process may use, for its worker, its trials and the fresh runs on it.

Trials that share a GPU take turns on it (`budgettune.trial.gpu_turns`: nothing else of that
GPU runs while one measures), but the other GPUs' trials compile meanwhile, each with a pool of
compile workers, on every core of the host. On a 4-GPU H200 host with 16 trials at once
(``--trials-per-gpu 4``), one configuration measured 56.7 to 65.2 ms in twelve trials, and that
noise (7.9 %) had the search pin full block AC over a point 6 % faster (issue 44). With a
share each, a GPU's compiles run on its own cores, and its measuring trial has them alone.

A share travels as `CPUS_ENV` (a Linux CPU list, ``0-15``) in the environment of the process
that must keep to it; `apply_cpu_share` (called first thing by a worker, a trial child and a
trial server) sets the process's affinity from it, and what the process starts inherits both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

logger = logging.getLogger(__name__)

CPUS_ENV = "BUDGETTUNE_CPUS"
"""The CPU list a budgettune process keeps to (set by the search for its workers and runs)."""
MAX_CPU = 2**16 - 1
"""The highest CPU number a CPU list may name (Linux's own limit is 8191 by default): a list of
``0-999999999`` built a set of 10^9 numbers, 22 GB, until the host's OOM killer came (issue 48)."""
MIN_CORES_PER_SHARE = 2
"""Fewer cores than this per GPU: no shares (the processes run on every core, as before)."""
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"
"""Inductor's compile workers per process (read when torch is imported; by default one per
core the process may use, at most 32)."""


def format_cpu_list(cores: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` → ``"0-3,8"`` (the kernel's CPU-list format, as taskset reads)."""
    ordered = sorted(set(cores))
    parts: list[str] = []
    start = previous = None
    for core in [*ordered, None]:
        if core is not None and previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = core
    return ",".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` → ``{0, 1, 2, 3, 8}``.

    Raises:
        ValueError: not a CPU list (or an empty one).
    """
    cores: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first or last > MAX_CPU:
            raise ValueError(f"not a CPU range of CPUs 0 to {MAX_CPU}: {part[:40]!r}")
        cores.update(range(first, last + 1))
    if not cores:
        raise ValueError("no CPUs")
    return cores


def cpu_shares(devices: Sequence[str], cores: Iterable[int] | None = None) -> dict[str, str]:
    """Each distinct device of ``devices`` (``cuda:N`` or a group ``cuda:N,M``) its share of
    ``cores`` (default: the cores this process may run on), contiguous and as even as they
    split, as a CPU list; none (an empty dict) for fewer than two devices, or fewer cores than
    `MIN_CORES_PER_SHARE` per device."""
    unique = list(dict.fromkeys(devices))
    if len(unique) < 2 or (cores is None and not hasattr(os, "sched_getaffinity")):
        return {}  # one device, or a system without affinities (not Linux)
    ordered = sorted(os.sched_getaffinity(0) if cores is None else set(cores))
    if len(ordered) < MIN_CORES_PER_SHARE * len(unique):
        return {}
    n, k = len(ordered), len(unique)
    return {
        device: format_cpu_list(ordered[i * n // k : (i + 1) * n // k])
        for i, device in enumerate(unique)
    }


def share_env(share: str | None, sharing: int) -> dict[str, str]:
    """The environment of a process that keeps to ``share`` (a CPU list, or None: every core
    of this process) with ``sharing`` - 1 other trials of its GPU: `CPUS_ENV`, and for a shared
    GPU inductor's compile workers split among them (`COMPILE_THREADS_ENV`), unless the user
    set that. Each trial would otherwise start a pool of one worker per core (four trials a
    GPU on 16 cores: 64 workers, each importing torch while the four compile); how many
    workers compile changes how soon the kernels are built, never which kernels, so what a
    trial measures is what its job runs."""
    env = {CPUS_ENV: share} if share else {}
    if sharing > 1 and COMPILE_THREADS_ENV not in os.environ:
        try:
            cores = len(parse_cpu_list(share)) if share else len(os.sched_getaffinity(0))
        except (ValueError, AttributeError):  # no affinities on this system: torch decides
            return env
        env[COMPILE_THREADS_ENV] = str(max(1, min(32, cores // sharing)))
    return env


def apply_cpu_share(environ: Mapping[str, str] | None = None) -> set[int] | None:
    """Keep this process (and what it starts from now on) to the cores `CPUS_ENV` names; the
    cores set, or None when it names none. A share that cannot be applied (cores this
    process may not use, no such call on this system) is said in one warning and ignored:
    the process runs as it would have without it."""
    value = (os.environ if environ is None else environ).get(CPUS_ENV, "")
    if not value:
        return None
    try:
        cores = parse_cpu_list(value)
        os.sched_setaffinity(0, cores)
    except (ValueError, OSError, AttributeError) as exc:
        logger.warning("%s=%r ignored: %s", CPUS_ENV, value, exc)
        return None
    return cores
