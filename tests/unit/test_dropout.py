"""The dropout a trial records and a job is compared with (issue 45: a job with dropout
peaked over a pin measured without, unwarned)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from budgettune.pinning import PinDocument, StalePinWarning, parse_pin
from budgettune.trial.dropout import active_dropout, dropout_warning
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec


class _Attention(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.attention_dropout = p  # as transformers' attention modules hold it
        self.proj = nn.Linear(4, 4)


def test_active_dropout_names_modules_and_attributes_above_zero() -> None:
    model = nn.Sequential(nn.Dropout(0.1), nn.Dropout(0.0), _Attention(0.2), nn.Dropout(0.1))
    assert active_dropout(model) == ("Dropout p=0.1", "attention_dropout=0.2")
    assert active_dropout(nn.Sequential(nn.Dropout(0.0), _Attention(0.0))) == ()


def test_only_dropout_the_pin_was_measured_without_is_warned() -> None:
    assert dropout_warning((), ("Dropout p=0.1",)) is not None
    assert dropout_warning(("Dropout p=0.1",), ("Dropout p=0.1",)) is None
    assert dropout_warning(None, ("Dropout p=0.1",)) is None  # a pin that did not record it
    assert dropout_warning((), ()) is None


def test_dropout_travels_from_the_result_to_the_pin_and_the_job_is_warned() -> None:
    result = TrialResult(outcome=TrialOutcome.CRASHED, error="x", dropout=["Dropout p=0.1"])
    assert TrialResult.from_json_dict(result.to_json_dict()).dropout == ("Dropout p=0.1",)
    old = TrialResult.from_json_dict({"outcome": "crashed", "error": "x"})
    assert old.dropout is None
    document = {
        "schema_version": 1,
        "spec": TrialSpec(compile_mode="eager").to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 10**9,
        "mem_metric": "device",
        "dropout": [],
    }
    pinned = parse_pin(document, source="pin.json")
    assert pinned.pin.dropout == ()
    assert PinDocument.from_json_dict(pinned.pin.to_json_dict()).dropout == ()
    with pytest.warns(StalePinWarning, match="measured with dropout off"):
        pinned.compile(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePinWarning)
        pinned.compile(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)))
    older = parse_pin({k: v for k, v in document.items() if k != "dropout"}, source="old.json")
    assert older.pin.dropout is None and "dropout" not in older.pin.to_json_dict()
    torch._dynamo.reset()
