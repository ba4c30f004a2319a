"""Choose the winner, write and read the pinned JSON, and apply it in a training job.

    pinned = budgettune.load_pinned("best.json")   # warns when the fingerprint is stale
    model = pinned.compile(model)                  # functorch config scoped, op list, AC, mode
    optimizer = pinned.optimizer(optimizer)        # the pinned optimizer implementation

`choose` is the search's side (which trial, the pin it gets), `document` the pin's typed
form (to and from its JSON), `pinned` the training job's (read, check the fingerprint,
apply). Torch is imported only when a pin is applied.
"""

from budgettune.pinning.advice import RESERVED_GAP_FRACTION, allocator_advice, phase_advice
from budgettune.pinning.choose import (
    SHARDING,
    Candidate,
    PinScope,
    ReferenceTrial,
    StalePinWarning,
    build_pin,
    choose_pin,
    fits_limit,
    margin_violation_bytes,
    measured_violation_bytes,
    qualified,
    reference_figures,
)
from budgettune.pinning.document import (
    SCHEMA_VERSION,
    MemorySplit,
    PinDocument,
    PinFingerprint,
    PinMeasured,
    PinReference,
    RankPeak,
)
from budgettune.pinning.output import check_pin_output, write_pin
from budgettune.pinning.pinned import PinnedConfig, load_pinned, parse_pin

__all__ = [
    "RESERVED_GAP_FRACTION",
    "SCHEMA_VERSION",
    "SHARDING",
    "Candidate",
    "MemorySplit",
    "PinDocument",
    "PinFingerprint",
    "PinMeasured",
    "PinReference",
    "PinScope",
    "PinnedConfig",
    "RankPeak",
    "ReferenceTrial",
    "StalePinWarning",
    "allocator_advice",
    "build_pin",
    "check_pin_output",
    "choose_pin",
    "fits_limit",
    "load_pinned",
    "margin_violation_bytes",
    "measured_violation_bytes",
    "parse_pin",
    "phase_advice",
    "qualified",
    "reference_figures",
    "write_pin",
]
