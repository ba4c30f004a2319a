"""The CUDA caching allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``), in a trial and in a job.

The setting is part of the measured configuration: a pin peaked 11 GB lower with
``expandable_segments:True`` than without it in the same job
(benchmarks/results/README.md#allocator-setting). torch reads ``PYTORCH_CUDA_ALLOC_CONF`` once,
when it loads its allocator config, which is at ``import torch`` on torch 2.13 (seen here: a
variable set after the import never reaches ``torch._C._accelerator_getAllocatorSettings()``).
So:

- before torch is imported, the environment variable is enough (the trial child sets it there);
- once torch is imported, the settings are changed through torch's setter
  (``torch._C._accelerator_setAllocatorSettings``, or ``torch.cuda.memory._set_allocator_settings``
  on older torch); before CUDA has allocated anything this is the same as the variable;
- once CUDA holds memory, ``expandable_segments`` applies to segments reserved from then on, not
  to those reserved already, and ``backend`` cannot change at all: `apply_allocator_settings`
  says so (`AllocatorApplied.caveat`) and the caller warns.

Torch is never imported here: a process that has not imported it gets the variable only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from budgettune.errors import SpecError

ENV_VAR = "PYTORCH_CUDA_ALLOC_CONF"
"""The variable the trial child sets and a launch script exports."""
SETTING_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:[A-Za-z0-9_.+-]+$")
"""One ``key:value`` of the allocator's settings (``expandable_segments:True``)."""
_FLAG = (re.compile(r"True|False"), "True or False")
_COUNT = (re.compile(r"[0-9]{1,9}"), "a whole number (at most 9 digits)")
_PER_SIZE = r"(?:[0-9]{1,9}|>):[0-9]{1,9}"
_DIVISIONS = (
    re.compile(rf"[0-9]{{1,9}}|\[{_PER_SIZE}(?:,{_PER_SIZE}){{0,31}}\]"),
    "a whole number or torch's per-size list like [256:8,>:1]",
)
BRACKETED = re.compile(r"^(roundup_power2_divisions):(\[[^\[\]]*\])$")
"""The one setting whose value torch takes as a list: ``roundup_power2_divisions:[256:8,>:1]``
(issue 48's P7-7: split at its commas, it was refused)."""
KNOWN_VALUES = {
    "expandable_segments": _FLAG,
    "release_lock_on_cudamalloc": _FLAG,
    "pinned_use_cuda_host_register": _FLAG,
    "pinned_use_background_threads": _FLAG,
    "max_split_size_mb": _COUNT,
    "roundup_power2_divisions": _DIVISIONS,
    "pinned_num_register_threads": _COUNT,
    "garbage_collection_threshold": (re.compile(r"0?\.[0-9]{1,6}"), "a fraction like 0.6"),
    "backend": (re.compile(r"native|cudaMallocAsync"), "native or cudaMallocAsync"),
}
"""The values torch's allocator takes for the settings it documents (issue 48's P6-5: torch
refused ``max_split_size_mb:abc`` and ``expandable_segments:maybe`` only in the trial, whose
child died without a result); a key not listed (a newer torch's) is left to torch."""
STARTUP_ONLY_KEYS = frozenset({"backend"})
"""Settings torch reads once, when CUDA starts (``backend:cudaMallocAsync``)."""


def split_settings(text: str) -> list[str]:
    """``text`` cut at the commas outside square brackets (``a:1,b:[1:2,>:1]`` is two
    entries), each stripped, empty ones left out."""
    entries, depth, start = [], 0, 0
    for at, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            entries.append(text[start:at])
            start = at + 1
    entries.append(text[start:])
    return [entry.strip() for entry in entries if entry.strip()]


def parse_settings(text: str) -> dict[str, str]:
    """``"a:1,b:True"`` as an ordered ``{"a": "1", "b": "True"}``.

    Raises:
        SpecError: an entry that is not ``key:value`` of letters, digits, ``_ . + -``
            (the allocator aborts the process on a malformed setting, so it is refused here).
    """
    settings: dict[str, str] = {}
    for entry in split_settings(text):
        if not SETTING_PATTERN.fullmatch(entry) and not BRACKETED.fullmatch(entry):
            raise SpecError(
                f"cuda_alloc_conf: {entry!r} is not a setting; write key:value pairs separated "
                "by commas, e.g. expandable_segments:True"
            )
        key, _, value = entry.partition(":")
        pattern, allowed = KNOWN_VALUES.get(key, (None, ""))
        if pattern is not None and not pattern.fullmatch(value):
            raise SpecError(f"cuda_alloc_conf: {entry!r}: torch takes {key} as {allowed}")
        settings[key] = value
    return settings


def format_settings(settings: Mapping[str, str]) -> str:
    """The inverse of `parse_settings`."""
    return ",".join(f"{key}:{value}" for key, value in settings.items())


def env_assignment(alloc_conf: str) -> str:
    """The shell line a launch script runs before the job starts (empty: nothing to set)."""
    settings = parse_settings(alloc_conf)
    return f"{ENV_VAR}={format_settings(settings)}" if settings else ""


def merged_setting(current: str, wanted: str) -> tuple[str, list[str]]:
    """``current`` with ``wanted``'s keys set; and the keys whose value ``wanted`` replaced."""
    settings = parse_settings(current) if current else {}
    replaced = []
    for key, value in parse_settings(wanted).items():
        if key in settings and settings[key] != value:
            replaced.append(f"{key}:{settings[key]}")
        settings[key] = value
    return format_settings(settings), replaced


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocatorApplied:
    """How a process took an allocator setting (`apply_allocator_settings`)."""

    setting: str
    """The setting applied (``""``: nothing to apply)."""
    how: str
    """``none`` (nothing to apply), ``environment`` (torch not imported yet), ``already``
    (the process has it), ``setter`` (torch imported, CUDA holding no memory: as good as the
    variable), ``runtime`` (CUDA held memory already) or ``unsupported`` (no setter)."""
    reserved_before_bytes: int = 0
    """CUDA memory reserved before the setting took effect (``runtime`` only)."""
    replaced: tuple[str, ...] = ()
    """Settings of the process's own that the pinned ones replaced."""
    caveat: str = ""
    """Why the process may not run as measured (empty when it does)."""


_APPLIED: set[str] = set()
"""Settings this process was given by `apply_allocator_settings` (for a torch that cannot say
which settings it has)."""


def _torch_setter(torch: Any) -> Any:
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if callable(setter):
        return setter
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    legacy = getattr(memory, "_set_allocator_settings", None)
    return legacy if callable(legacy) else None


def _torch_current(torch: Any) -> str | None:
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if callable(getter):
        value = getter()
        return value if isinstance(value, str) else None
    return None


def _reserved_bytes(torch: Any) -> int:
    """CUDA memory reserved by this process's allocator, over every device it has touched."""
    if not torch.cuda.is_initialized():
        return 0
    return sum(torch.cuda.memory_reserved(index) for index in range(torch.cuda.device_count()))


def _refused(alloc_conf: str, before: str, exc: Exception) -> SpecError:
    """Torch's parser refused a value (``max_split_size_mb:abc``): the variable as it was, and
    one line naming the setting (issue 48: not torch's bare ``ValueError: stoull``)."""
    os.environ[ENV_VAR] = before
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    return SpecError(f"cuda_alloc_conf {alloc_conf!r:.200}: torch refuses it ({reason:.200})")


def apply_allocator_settings(alloc_conf: str) -> AllocatorApplied:
    """Give this process the allocator setting as early as it still can take it.

    Args:
        alloc_conf: ``key:value`` pairs (`TrialSpec.cuda_alloc_conf`); empty: nothing to do.

    Returns:
        What was done, with a caveat when CUDA had reserved memory already or this torch
        cannot take the setting.

    Raises:
        SpecError: a malformed setting, or a value torch refuses.
    """
    wanted = parse_settings(alloc_conf)
    if not wanted:
        return AllocatorApplied(setting="", how="none")
    before = os.environ.get(ENV_VAR, "")
    merged, replaced = merged_setting(before, alloc_conf)
    os.environ[ENV_VAR] = merged  # child processes (torchrun ranks, data workers) inherit it
    torch = sys.modules.get("torch")
    if torch is None:
        _APPLIED.add(alloc_conf)
        return AllocatorApplied(setting=alloc_conf, how="environment", replaced=tuple(replaced))
    try:
        current = _torch_current(torch)  # torch parses the variable set above
    except (ValueError, IndexError, RuntimeError) as exc:
        raise _refused(alloc_conf, before, exc) from None
    if current is not None:
        if wanted.items() <= parse_settings(current).items():
            return AllocatorApplied(setting=alloc_conf, how="already")
        merged, replaced = merged_setting(current, alloc_conf)
    elif alloc_conf in _APPLIED:
        return AllocatorApplied(setting=alloc_conf, how="already")
    setter = _torch_setter(torch)
    if setter is None:
        return AllocatorApplied(
            setting=alloc_conf,
            how="unsupported",
            replaced=tuple(replaced),
            caveat=(
                f"torch {torch.__version__} has no allocator setter and was imported before "
                f"the pin was loaded: export {env_assignment(alloc_conf)} before the job starts"
            ),
        )
    reserved = _reserved_bytes(torch)
    try:
        setter(merged)
    except (ValueError, IndexError, RuntimeError) as exc:  # a value torch's parser refuses
        raise _refused(alloc_conf, before, exc) from None
    _APPLIED.add(alloc_conf)
    if not reserved:
        return AllocatorApplied(setting=alloc_conf, how="setter", replaced=tuple(replaced))
    late = sorted(STARTUP_ONLY_KEYS & set(parse_settings(alloc_conf)))
    caveat = (
        f"CUDA already held {reserved / 1e9:.2f} GB when the pin was loaded: {alloc_conf} "
        "applies to memory reserved from now on, not to that"
    )
    if late:
        caveat += f", and {', '.join(late)} cannot change once CUDA has started"
    return AllocatorApplied(
        setting=alloc_conf,
        how="runtime",
        reserved_before_bytes=reserved,
        replaced=tuple(replaced),
        caveat=caveat,
    )
