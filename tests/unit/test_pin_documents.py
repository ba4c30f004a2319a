"""The pin as frozen dataclasses (issue 31): every pin budgettune has written still loads and
reads back without losing a key, and the search writes the document it always wrote."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from storage_samples import SPEC, ok_result

from budgettune.errors import PinnedConfigError
from budgettune.pinning import (
    Candidate,
    PinDocument,
    PinScope,
    ReferenceTrial,
    build_pin,
    load_pinned,
    parse_pin,
    write_pin,
)
from budgettune.present.dashboard_views import study_note
from budgettune.present.tables import pin_table
from budgettune.trial.spec import TrialSpec

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _pin_files() -> list[Path]:
    found = []
    for path in sorted(RESULTS.rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "schema_version" in data:
            found.append(path)
    return found


def _stored_pins() -> list[tuple[str, dict[str, Any]]]:
    """The pins recorded in the committed study databases (what `show` and `export` read)."""
    pins = []
    for db in sorted(RESULTS.rglob("*.db")):
        connection = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
        try:
            rows = connection.execute("SELECT id, pin_json FROM bt_pins").fetchall()
        finally:
            connection.close()
        name = db.relative_to(RESULTS)
        pins += [(f"{name}#{row_id}", json.loads(text)) for row_id, text in rows]
    return pins


PIN_FILES = _pin_files()
STORED_PINS = _stored_pins()


def _unmakeable(document: dict[str, Any]) -> bool:
    """A committed pin recording a model change this budgettune no longer makes."""
    from budgettune.trial.hf_cache import KNOWN_MODEL_CHANGES

    return bool(set(document.get("model_changes") or ()) - set(KNOWN_MODEL_CHANGES))


def _normalized(value: Any, key: str = "") -> Any:
    """A document with every spec read as a `TrialSpec` (a spec written before a knob existed
    gains that knob's default when written again)."""
    if key == "spec":
        return TrialSpec.from_json_dict(value)
    if isinstance(value, dict):
        return {k: _normalized(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _kept(original: dict[str, Any], written: dict[str, Any]) -> dict[str, Any]:
    """``written`` cut to the keys ``original`` has, at every depth."""
    out = {}
    for key, value in original.items():
        if key not in written:
            continue
        again = written[key]
        if isinstance(value, dict) and isinstance(again, dict) and key != "spec":
            again = _kept(value, again)
        elif isinstance(value, list) and isinstance(again, list):
            again = [
                _kept(o, w) if isinstance(o, dict) and isinstance(w, dict) else w
                for o, w in zip(value, again, strict=False)
            ]
        out[key] = again
    return out


def test_there_are_committed_pins_to_read() -> None:
    assert len(PIN_FILES) >= 20 and len(STORED_PINS) >= 12


@pytest.mark.parametrize("path", PIN_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_pin_loads_and_reads_back_whole(path: Path) -> None:
    original = json.loads(path.read_text())
    if _unmakeable(original):
        # issue 44's first GPT-2 run recorded a model change later dropped (loss_type): such a
        # pin is refused as it is read, in one line, rather than failing in the job (issue 48)
        with pytest.raises(PinnedConfigError, match="cannot make: loss_type=ForCausalLM"):
            load_pinned(path, warn=False, apply_allocator=False)
        return
    pinned = load_pinned(path, warn=False, apply_allocator=False)
    assert pinned.document == original  # `export --pin` writes it again as it was read
    written = pinned.pin.to_json_dict()
    assert _normalized(_kept(original, written)) == _normalized(original)
    assert PinDocument.from_json_dict(written) == pinned.pin
    assert pin_table(pinned.pin).row_count > 5


@pytest.mark.parametrize(("name", "document"), STORED_PINS, ids=[n for n, _ in STORED_PINS])
def test_every_pin_stored_in_a_committed_study_reads(name: str, document: dict) -> None:
    if _unmakeable(document):  # as above: refused in one line as it is read
        with pytest.raises(PinnedConfigError, match="cannot make: loss_type=ForCausalLM"):
            parse_pin(document, source=name)
        return
    pin = parse_pin(document, source=name).pin
    assert _normalized(_kept(document, pin.to_json_dict())) == _normalized(document)
    assert "Current pin" in study_note(
        study_name=name, search={}, points=[], num_failed=0, pin=pin
    )


def test_a_new_pin_has_the_keys_of_the_pins_written_before() -> None:
    newest = json.loads((RESULTS / "h200-tuner-2026-11-25" / "tuner-L1-pin.json").read_text())
    scope = PinScope(
        study_name="s", workload="builtin:tiny-gpt", workload_options={}, device="cpu",
        limit_bytes=15_000_000_000, mem_metric="device", margin=0.03,
    )  # fmt: skip
    reference = ReferenceTrial(
        spec=TrialSpec(), peak_bytes=19_000_000_000, peak_device_bytes=19_000_000_000,
        step_time_ms=60.0, peak_phase="backward",
    )  # fmt: skip
    pin = build_pin(
        scope=scope,
        candidate=Candidate(trial_number=3, spec=SPEC, step_time_ms=60.0, peak_bytes=1),
        reverify_results=[ok_result(), ok_result()],
        baseline=reference,
        baseline_results=[ok_result()],
        trials=4,
    )
    document = pin.to_json_dict()
    assert sorted(document) == sorted(newest)
    # issue 44: how many of the pin's runs started with empty compile caches (a fresh host's)
    # and (issue 45) the spread of the runs beside each median
    assert sorted(document["measured"]) == sorted(
        [*newest["measured"], "cold_runs", "step_time_range_ms"]
    )
    assert document["measured"]["cold_runs"] == 0
    ms = document["measured"]["step_time_ms"]
    assert document["measured"]["step_time_range_ms"] == [ms, ms]
    assert sorted(document["baseline"]) == sorted([*newest["baseline"], "step_time_range_ms"])
    assert PinDocument.from_json_dict(document).to_json_dict() == document
    assert sorted(document["fingerprint"]) == sorted(newest["fingerprint"])
    assert document["full_ac"] is None and document["op_sac"] is None
    assert pin.reference() == pin.baseline


def test_write_pin_takes_the_typed_pin_or_its_json(tmp_path: Path) -> None:
    pinned = load_pinned(PIN_FILES[0], warn=False, apply_allocator=False)
    typed = write_pin(tmp_path / "typed.json", pinned.pin)
    as_json = write_pin(tmp_path / "json.json", pinned.pin.to_json_dict())
    assert typed.read_text() == as_json.read_text()
    assert load_pinned(typed, warn=False, apply_allocator=False).pin == pinned.pin


_CPU_SCOPE = PinScope(
    study_name="s", workload="builtin:tiny-gpt", workload_options={}, device="cpu",
    limit_bytes=15_000_000_000, mem_metric="device", margin=0.03,
)  # fmt: skip
"""The pin-table tests' scope: a 15 GB limit that budget 1.0's 19 GB does not fit."""


def _over_limit_baseline() -> ReferenceTrial:
    return ReferenceTrial(
        spec=TrialSpec(), peak_bytes=19_000_000_000, peak_device_bytes=19_000_000_000,
        step_time_ms=8.0,
    )  # fmt: skip


def _rendered(pin: PinDocument) -> str:
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    Console(file=out, width=200).print(pin_table(pin))
    return out.getvalue()


def test_the_pin_table_gives_the_spread_and_names_a_reference_that_is_the_pin() -> None:
    from budgettune.pinning import build_pin
    from budgettune.trial.results import TrialResult

    def timed(ms: float) -> TrialResult:
        result = ok_result()
        assert result.measurement is not None
        return result.replace(measurement=dataclasses.replace(result.measurement, step_time_ms=ms))

    full_ac = TrialSpec(block_ac_every=1)
    pin = build_pin(
        scope=_CPU_SCOPE,
        candidate=Candidate(trial_number=1, spec=full_ac, step_time_ms=9.0, peak_bytes=1),
        reverify_results=[timed(9.0), timed(9.5), timed(9.2)],
        baseline=_over_limit_baseline(),
        baseline_results=[timed(8.0), timed(8.4)],
        baseline_status="over_limit",
        full_ac=ReferenceTrial(
            spec=full_ac, peak_bytes=1, peak_device_bytes=1, step_time_ms=9.0
        ),
        full_ac_results=[timed(9.0), timed(9.5), timed(9.2)],
        trials=4,
    )  # fmt: skip
    text = _rendered(pin)
    assert "9.20 ms (median of re-measurements, 9.00-9.50 ms)" in text
    assert "(median of 2 runs, 8.00-8.40 ms) (does not fit the limit)" in text
    assert "the pin is this configuration" in text


def test_the_pin_table_of_one_cold_run_says_so_without_worst_or_median() -> None:
    # a one-GPU search re-measured its pin once, cold: it printed "worst of 1 run, 1 of them
    # with empty compile caches" and "median of re-measurements" (2026-11-29)
    from budgettune.pinning import build_pin

    cold = ok_result().replace(cold_caches=True)
    pin = build_pin(
        scope=_CPU_SCOPE,
        candidate=Candidate(trial_number=1, spec=TrialSpec(block_ac_every=1), step_time_ms=9.0,
                            peak_bytes=1),
        reverify_results=[cold],
        baseline=_over_limit_baseline(),
        baseline_results=[ok_result()],
        baseline_status="over_limit",
        trials=4,
    )  # fmt: skip
    assert pin.measured.runs == 1 and pin.measured.cold_runs == 1
    text = _rendered(pin)
    assert "(1 run, with empty compile caches, as on a fresh host), set in" in text
    assert "ms (1 re-measurement)" in text
    assert " peak x 1.03 (the margin)" in text
    assert "worst" not in text and "median of re-measurements" not in text
    assert " ms (1 run) (does not fit the limit)" in text and "median of 1" not in text
    note = study_note(study_name="s", search={}, points=[], num_failed=0, pin=pin)
    assert "| peak device (1 re-measurement) |" in note and "| step time |" in note
    assert "worst of" not in note
