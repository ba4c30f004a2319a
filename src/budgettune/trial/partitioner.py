"""The partitioner's knobs applied to torch: the functorch settings and the recomputable ops.

The trial child and a user's job (through `recompute`) both run every compiled call inside
`partitioner_settings(spec)`; nothing is set globally. Each knob with a ``functorch_key`` is
patched here by name (`PARTITIONER_KNOBS`), so a new partitioner knob needs no code here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from budgettune.errors import SpecError
from budgettune.trial.spec import KNOBS, TrialSpec

PARTITIONER_KNOBS = tuple(k for k in KNOBS if k.functorch_key is not None)
"""The knobs that are ``torch._functorch.config`` settings, scoped by `partitioner_settings`."""
_ALWAYS_SET = ("activation_memory_budget", "knapsack_solver", "runtime_estimator")
"""Partitioner knobs of every supported torch (>= 2.6): set even at their default."""


def resolve_ops(names: Sequence[str]) -> list[Any]:
    """Resolve op names to torch op packets: ``aten.add`` → ``torch.ops.aten.add``.

    Args:
        names: ``namespace.op`` names (namespace ``aten`` or ``prims``), no overload suffix.

    Returns:
        The `OpOverloadPacket` of each name, in order (the partitioner's op lists hold packets).

    Raises:
        SpecError: when a name is malformed or no such op exists in this torch.
    """
    import torch

    ops = []
    for name in names:
        namespace, _, op_name = name.partition(".")
        if namespace not in ("aten", "prims") or not op_name or "." in op_name:
            raise SpecError(
                f"unknown op {name!r}; write an aten or prims op without overload, "
                "e.g. aten.add or prims.convert_element_type"
            )
        try:
            op = getattr(getattr(torch.ops, namespace), op_name)
        except (AttributeError, RuntimeError):
            op = None
        if not isinstance(op, torch._ops.OpOverloadPacket):
            raise SpecError(
                f"unknown op {name!r} in torch {torch.__version__}; write an existing "
                "aten/prims op without overload, e.g. aten.add or aten.mm"
            )
        ops.append(op)
    return ops


def check_spec_supported(spec: TrialSpec, device_type: str) -> None:
    """Fail early, before anything compiles, on a spec this process cannot run.

    Args:
        spec: the configuration.
        device_type: ``cpu`` or ``cuda``.

    Raises:
        SpecError: profile estimator off CUDA, ilp solver without scipy, unknown ops, a
            partitioner that lacks a knob the spec sets, or ``op_offload`` eager or on a torch
            without the partitioner's activation offloading.
    """
    import torch._functorch.config as functorch_config
    import torch._functorch.partitioners as partitioners

    if spec.is_compiled and spec.runtime_estimator == "profile" and device_type != "cuda":
        raise SpecError(
            f"runtime_estimator 'profile' benchmarks ops on a GPU and needs CUDA, not "
            f"{device_type!r}; use runtime_estimator 'flops'"
        )
    if spec.is_compiled and spec.knapsack_solver == "ilp":
        if importlib.util.find_spec("scipy") is None:
            raise SpecError("knapsack_solver 'ilp' needs scipy: run `pip install scipy`")
    for k in PARTITIONER_KNOBS:
        if not hasattr(functorch_config, str(k.functorch_key)) and (
            k.name in _ALWAYS_SET or getattr(spec, k.name) != k.default
        ):
            raise SpecError(
                f"this torch's functorch config has no {k.functorch_key} (knob {k.name}); "
                "upgrade torch"
                + (" (>= 2.6)" if k.name in _ALWAYS_SET else f" or leave {k.name} at its default")
            )
    if spec.recompute_ops_removed or spec.recompute_ops_added:
        if not callable(getattr(partitioners, "get_default_op_list", None)):
            raise SpecError(
                "this torch's partitioner has no get_default_op_list, so the recomputable "
                "op list cannot be changed; upgrade torch or leave the op lists empty"
            )
    if spec.compiled_offload:
        check_compiled_offload_available()
    resolve_ops(spec.recompute_ops_removed)
    resolve_ops(spec.recompute_ops_added)


def check_compiled_offload_available() -> None:
    """Refuse ``op_offload`` on a torch without the partitioner's activation offloading.

    Raises:
        SpecError: one line naming what is missing and what to use instead.
    """
    import torch
    import torch._functorch.config as functorch_config

    missing = [
        name
        for name in (COMPILED_OFFLOAD_SETTINGS[0], "joint_custom_pass")
        if not hasattr(functorch_config, name)
    ]
    if missing:
        raise SpecError(
            f"torch {torch.__version__} has no compiled activation offloading "
            f"(torch._functorch.config.{' and '.join(missing)}); "
            "use offload_every (saved-tensor hooks, any torch) or upgrade torch"
        )


def _op_list_override(
    original: Callable[[], Any], removed: Sequence[Any], added: Sequence[Any]
) -> Callable[[], Any]:
    """A `get_default_op_list` that edits the recomputable list of the original's result.

    The partitioner derives ``fusible_ops = recomputable_ops | random_ops`` and uses fusibility
    to decide whether saving a node materialises it; we keep that invariant, so an added op
    (e.g. aten.mm) is not banned as "materialized in backward" before the allowlist is even
    consulted. The original returns a fresh `OpTypes` per call; we still build a new one.
    """

    @functools.wraps(original)
    def get_default_op_list() -> Any:
        op_types = original()
        for attr in ("recomputable_ops", "fusible_ops", "random_ops"):
            if not hasattr(op_types, attr):
                raise RuntimeError(
                    f"torch's partitioner OpTypes has no {attr}; this torch is not supported "
                    "for recompute op-list overrides"
                )
        ordered_set = type(op_types.recomputable_ops)
        recomputable = ordered_set(
            [op for op in op_types.recomputable_ops if op not in removed]
            + [op for op in added if op not in op_types.recomputable_ops]
        )
        fusible = ordered_set(
            [op for op in op_types.fusible_ops if op not in removed or op in op_types.random_ops]
            + [op for op in added if op not in op_types.fusible_ops]
        )
        return dataclasses.replace(op_types, recomputable_ops=recomputable, fusible_ops=fusible)

    return get_default_op_list


COMPILED_OFFLOAD_SETTINGS = (
    "enable_activation_offloading",
    "activation_offload_separate_stream",
    "activation_offload_sink_wait",
    "activation_reload_prefetch",
)
"""The partitioner's offload settings turned on for ``block_ac_policy="op_offload"`` (the
first is required, the others are used where this torch has them): the copies on their own
stream, the forward's wait sunk to the last use, the backward's reload prefetched. The nodes
to move are marked by `mark_saved_for_offload`, set as ``joint_custom_pass``."""


def mark_saved_for_offload(gm: Any, joint_inputs: Any) -> Any:
    """The ``joint_custom_pass`` of ``op_offload``: mark what the op policy saves
    (``recompute == MUST_SAVE``) ``should_offload``, which the partitioner's offloading moves
    (nothing in torch turns a ``MUST_CPU_OFFLOAD`` policy into that mark), except in the last
    checkpointed region, whose activations the backward uses first (torchtitan skips it too).
    """
    from torch.utils.checkpoint import CheckpointPolicy

    saved = [n for n in gm.graph.nodes if n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE]
    regions = {n.meta.get("ac_graph_id") for n in saved} - {None}
    last = max(regions) if len(regions) > 1 else None
    for node in saved:
        if last is None or node.meta.get("ac_graph_id") != last:
            node.meta["should_offload"] = True
    return gm


def keep_random_draws(gm: Any, joint_inputs: Any) -> Any:
    """The ``joint_custom_pass`` of a budget below 1.0: every random op outside a
    checkpointed region is marked ``MUST_SAVE``, so the memory-budget knapsack never
    recomputes it. torch bans recomputing random ops, but the knapsack re-allows what it
    banned, and the recomputed draw in backward is a new one (pytorch#190758): dropout's
    backward then applies another mask than the forward did, and the gradients are silently
    wrong (a tiny GPT-2 with dropout 0.1 on CPU: gradient norm 2.4 % off at budget 0.5). torch
    marks collectives ``MUST_SAVE`` for the same reason. A checkpointed region's random ops
    (block AC) keep their own tag: the checkpoint replays their random state.
    """
    import torch
    import torch._functorch.partitioners as partitioners
    from torch.utils.checkpoint import CheckpointPolicy

    op_types = partitioners.get_default_op_list()
    seeded = torch.Tag.nondeterministic_seeded

    def random(node: Any) -> bool:  # the tag torch's own rng passes read (aten.rand, ...)
        target = node.target
        tagged = isinstance(target, torch._ops.OpOverload) and seeded in target.tags
        return tagged or op_types.is_random(node)

    for node in gm.graph.nodes:
        if node.op == "call_function" and "recompute" not in node.meta and random(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return gm


def _passes(*passes: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def joint_pass(gm: Any, joint_inputs: Any) -> Any:
        for one in passes:
            gm = one(gm, joint_inputs)
        return gm

    return passes[0] if len(passes) == 1 else joint_pass


def functorch_settings(spec: TrialSpec, functorch_config: Any) -> dict[str, Any]:
    """The ``torch._functorch.config`` values of the spec's partitioner knobs: every one this
    torch has (a knob at its default that this torch lacks is left out; `check_spec_supported`
    refuses one set to another value), and the offload settings this torch has when the spec
    uses the compiled offload."""
    settings = {
        str(k.functorch_key): getattr(spec, k.name)
        for k in PARTITIONER_KNOBS
        if k.name in _ALWAYS_SET or hasattr(functorch_config, str(k.functorch_key))
    }
    if spec.compiled_offload:
        import torch

        # the side-stream variants need CUDA streams; without CUDA the copies are synchronous
        wanted = COMPILED_OFFLOAD_SETTINGS if torch.cuda.is_available() else ()
        settings |= {COMPILED_OFFLOAD_SETTINGS[0]: True}
        settings |= {name: True for name in wanted if hasattr(functorch_config, name)}
    passes = [mark_saved_for_offload] if spec.compiled_offload else []
    if 0.0 < spec.activation_memory_budget < 1.0:
        passes.append(keep_random_draws)
    if passes:
        settings["joint_custom_pass"] = _passes(*passes)
    return settings


@contextlib.contextmanager
def partitioner_settings(spec: TrialSpec) -> Iterator[None]:
    """Scope the spec's partitioner knobs (every `PARTITIONER_KNOBS` setting) and the
    recomputable ops.

    Everything is restored on exit, including after an exception. Nested use is allowed (the
    inner spec wins inside).

    Raises:
        SpecError: on an unknown op name.
    """
    import torch._functorch.config as functorch_config
    import torch._functorch.partitioners as partitioners

    removed = resolve_ops(spec.recompute_ops_removed)
    added = resolve_ops(spec.recompute_ops_added)
    patch = functorch_config.patch(functorch_settings(spec, functorch_config))
    with patch:
        if not removed and not added:
            yield
            return
        original = partitioners.get_default_op_list
        partitioners.get_default_op_list = _op_list_override(original, removed, added)
        try:
            yield
        finally:
            partitioners.get_default_op_list = original
