"""The numerics check: a recompute setting must not change the first step's loss or grad norm.

Budgets below 1.0 can silently corrupt gradients with random ops (pytorch#190758), so every
measured trial is compared with the study's budget-1.0 reference; a mismatch is infeasible.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from budgettune.trial.results import TrialOutcome, TrialResult

if TYPE_CHECKING:
    from budgettune.storage.user_attrs import TrialRecord
    from budgettune.trial.spec import TrialSpec


def numerics_tolerance(fingerprint: dict[str, Any] | None) -> float:
    """Relative tolerance for first-step loss / grad norm vs the budget-1.0 reference.

    Recompute changes the order of floating-point work; 16-bit parameters drift much more.
    """
    if fingerprint and fingerprint.get("param_count"):
        bytes_per_param = fingerprint["param_bytes"] / fingerprint["param_count"]
        if bytes_per_param < 4:
            return 3e-2
    return 1e-3


def check_numerics(result: TrialResult, reference: dict[str, float] | None) -> TrialResult:
    """Mark a measured result ``numerics_mismatch`` when it is off the study's reference."""
    m = result.measurement
    if reference is None or m is None or result.outcome is not TrialOutcome.OK:
        return result
    tolerance = numerics_tolerance(
        dict(result.workload_fingerprint) if result.workload_fingerprint else None
    )
    for name in ("loss", "grad_norm"):
        expected, got = reference[name], getattr(m, name)
        if not math.isfinite(got) or abs(got - expected) > tolerance * max(abs(expected), 1e-12):
            return result.replace(
                outcome=TrialOutcome.NUMERICS_MISMATCH,
                error=(
                    f"first-step {name} {got:.6g} is off the budget-1.0 reference {expected:.6g} "
                    f"(tolerance {tolerance:g} relative)"
                ),
            )
    return result


def reference_at(baseline: TrialRecord | None, spec: TrialSpec) -> dict[str, float] | None:
    """First-step loss and grad norm of the unconstrained ``baseline``, if it was measured at
    ``spec``'s micro-batch (another micro-batch is other data: nothing to compare)."""
    if baseline is None or (baseline.spec and baseline.spec.micro_batch != spec.micro_batch):
        return None
    return baseline.first_step()
