"""A module's forward compiled in place, the spec's partitioner settings scoped to its calls.

`pinned.compile(model)` returns a wrapper module; a trainer that holds the model (transformers'
`Trainer`, a `LightningModule`) cannot take one without losing what it reads from the model:
its class (``save_pretrained``, ``config``), its state_dict keys, the parameters of its
``forward`` (the `Trainer` drops the dataset columns ``forward`` does not take). So here the
model stays the same object: its instance ``forward`` becomes a bound method that runs the
compiled original inside `partitioner_settings(spec)`, and reports the original's signature.
What is compiled is the model's forward, as in a trial (which compiles the module; with no
hooks on the model, the same graph).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgettune.errors import SpecError
from budgettune.trial.recompute import compile_model, partitioner_settings
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    from torch import nn

_MARK = "_budgettune_scoped_forward"


@dataclass(kw_only=True)
class ScopedForward:
    """What `compile_forward_in_place` installed on a module (mutable: it counts calls)."""

    spec: TrialSpec
    """The applied configuration."""
    calls: int = 0
    """How often the compiled forward ran: 0 after a training step means the trainer called
    another module, and the pin's compile and partitioner settings never ran."""


def scoped_forward_of(module: nn.Module) -> ScopedForward | None:
    """The `ScopedForward` installed on ``module``, or None."""
    found = getattr(module, _MARK, None)
    return found if isinstance(found, ScopedForward) else None


def compile_forward_in_place(
    module: nn.Module, spec: TrialSpec, *, blocks_compiled: bool = False
) -> ScopedForward | None:
    """Compile ``module.forward`` as the spec says, in place, its calls inside the spec's
    partitioner settings (the backward's partition is chosen during the forward call).

    Args:
        module: the model a trainer holds.
        spec: the pinned configuration (``eager``: nothing is done).
        blocks_compiled: its blocks are compiled one by one already (offload: the hooks sit
            around them); the forward is then only scoped, not compiled as a whole.

    Returns:
        The installed `ScopedForward` (None when the spec is eager).

    Raises:
        SpecError: the module's forward was compiled in place already.
    """
    if not spec.is_compiled:
        return None
    if scoped_forward_of(module) is not None:
        raise SpecError(f"{type(module).__name__}.forward is compiled in place already")
    original: Callable[..., Any] = module.forward
    compiled = original if blocks_compiled else compile_model(original, spec)
    state = ScopedForward(spec=spec)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        state.calls += 1
        with partitioner_settings(spec):
            return compiled(*args, **kwargs)

    # A bound method, so what inspects or rebinds forward.__func__ (accelerate's autocast
    # wrapper) gets a function taking self; its signature is the original's.
    signature = inspect.signature(original)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()]
    )
    forward.__doc__ = original.__doc__
    forward.__name__ = getattr(original, "__name__", "forward")
    module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
    setattr(module, _MARK, state)
    return state
