"""When a knob matters for a spec: the ``relevant`` functions of `TrialSpec`'s knobs that
read more than one other knob (the search samples a knob, and `show` blames and renders it,
only where it is relevant). Each reads only knobs declared above the one it serves.
"""

from __future__ import annotations

from typing import Any

TrialSpec = Any
"""A `budgettune.trial.spec.TrialSpec` (not imported: spec imports this module)."""

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""Compile modes that capture CUDA graphs (their memory pool is overwritten at each replay)."""


def compiled(spec: TrialSpec) -> bool:
    return spec.compile_mode != "eager"


def below_one(spec: TrialSpec) -> bool:
    return spec.compile_mode != "eager" and spec.activation_memory_budget < 1.0


def offload_relevant(spec: TrialSpec) -> bool:
    """Where ``offload_every`` can run and move something (the search samples it only there):
    not eager with every block under AC (checkpoint's hooks hold it all), not with CUDA graphs
    (the next replay overwrites what a copy may still read), not compiled with the op policy
    and a budget below 1 (block by block AOTAutograd fails on it on torch 2.13)."""
    if spec.compile_mode in CUDA_GRAPH_MODES:
        return False
    if not spec.is_compiled:
        return spec.block_ac_every != 1
    return blocks_compile(spec)


def blocks_compile(spec: TrialSpec) -> bool:
    """Whether the blocks can be compiled one by one: not under the op policy with a budget
    below 1 (AOTAutograd fails on it block by block on torch 2.13: a tuple among the saved
    tensors; the whole-model compile takes it)."""
    selective = spec.block_ac_every and spec.block_ac_policy in ("op", "op_offload")
    return spec.is_compiled and not (selective and spec.activation_memory_budget < 1.0)
