"""The dropout a model runs in training, as a trial records it and a job compares it.

Dropout's masks are saved for backward, so a model with dropout peaks higher than the same
model without it (issue 45: a `Trainer` job with GPT-2's 0.1 peaked 14 % over a pin measured
with dropout 0). The ``hf:`` builders set it to 0 unless ``keep_dropout=true`` (recompute
re-draws the masks); `write_workload` keeps a `Trainer`'s. A trial records what its model ran
(`active_dropout`, in the result and the pin); `PinnedConfig.compile` warns when the job runs
dropout that the pin was measured without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def active_dropout(model: nn.Module) -> tuple[str, ...]:
    """Every dropout ``model`` draws in training, once each, sorted: its dropout modules with
    ``p > 0`` (``Dropout p=0.1``) and the float attributes of its modules named for dropout
    that are above 0 (``attention_dropout=0.1``, as `transformers`' attention reads them)."""
    from torch.nn.modules.dropout import _DropoutNd

    found: set[str] = set()
    for module in model.modules():
        if isinstance(module, _DropoutNd):
            if module.p > 0:
                found.add(f"{type(module).__name__} p={module.p:g}")
            continue
        for name, value in vars(module).items():
            if "dropout" in name and type(value) is float and value > 0:
                found.add(f"{name}={value:g}")
    return tuple(sorted(found))


def dropout_warning(pinned: tuple[str, ...] | None, running: tuple[str, ...]) -> str | None:
    """What to say when a job runs dropout the pin was measured without (None: nothing; a
    pin that did not record its dropout says nothing either)."""
    if pinned is None or pinned or not running:
        return None
    return (
        f"the pin was measured with dropout off and this model draws dropout "
        f"({', '.join(running)}): its saved masks make the step peak higher than the pin "
        "says; search with the job's dropout (-o keep_dropout=true for hf: workloads)"
    )
