"""A trial's user attrs as one typed record (issue 31): what the search writes is what it always
wrote, it reads back to the same record, and every study committed under benchmarks/results
(written by older budgettunes) reads back without losing an attr."""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from storage_samples import SPEC, crashed_result, ok_result

from budgettune.storage.user_attrs import RankRecord, TrialRecord, result_attrs, violation_of
from budgettune.trial.ranks import merge_rank_results
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
STUDY_DBS = sorted(RESULTS.rglob("*.db"))


def test_a_measured_result_writes_the_attrs_it_always_wrote() -> None:
    attrs = result_attrs(SPEC, ok_result())
    assert attrs == {
        "outcome": "ok",
        "error": "",
        "failed_stage": "",
        "spec": SPEC.to_json_dict(),
        "log_path": "/runs/trial-3.log",
        "wall_s": 41.0,
        "device_name": "NVIDIA H200",
        "torch_version": "2.11.0",
        "world_size": 1,
        "peak_allocated_bytes": 13_110_000_000,
        "peak_reserved_bytes": 13_500_000_000,
        "peak_device_bytes": 14_050_000_000,
        "steady_bytes": 9_000_000_000,
        "phase_peak_bytes": {"forward": 11_000, "backward": 13_110, "optimizer": 12_000},
        "peak_phase": "backward",
        "step_time_ms": 62.9,
        "step_time_p10_ms": 62.1,
        "step_time_p90_ms": 64.0,
        "compile_s": 25.5,
        "loss": 2.5,
        "grad_norm": 1.75,
        "host_peak_bytes": 0,  # since issue 33: no offload, no host memory held
        "offload_bytes": 0,
    }
    record = TrialRecord.from_attrs(attrs)
    assert record.outcome is TrialOutcome.OK and record.measured
    assert record.peak_bytes("reserved") == 13_500_000_000 and record.spec == SPEC
    assert record.to_attrs() == attrs


def test_a_crash_and_a_sharded_trial_round_trip() -> None:
    crashed = result_attrs(TrialSpec(), crashed_result())
    assert "step_time_ms" not in crashed and "ranks" not in crashed
    assert TrialRecord.from_attrs(crashed).to_attrs() == crashed
    rank = ok_result()
    assert rank.measurement is not None
    merged = merge_rank_results(
        {0: rank, 1: replace(rank, measurement=replace(rank.measurement, step_time_ms=70.0))}
    )
    sharded = result_attrs(SPEC, merged)
    assert sharded["world_size"] == 2 and sharded["failed_rank"] is None
    assert [r["rank"] for r in sharded["ranks"]] == [0, 1]
    assert "error" not in sharded["ranks"][0]  # written only when a rank failed
    record = TrialRecord.from_attrs(json.loads(json.dumps(sharded)))
    assert record.ranks[1] == RankRecord.from_json_dict(sharded["ranks"][1])
    assert record.ranks[1].step_time_ms == 70.0
    assert record.to_attrs() == sharded


def test_queue_labels_and_constraint_are_part_of_the_record() -> None:
    queued = TrialRecord(baseline="unconstrained", enqueued_spec=TrialSpec(seed=3))
    attrs = queued.to_attrs()
    spec = TrialSpec(seed=3).to_json_dict()
    assert attrs == {"baseline": "unconstrained", "enqueued_spec": spec}
    assert not TrialRecord.from_attrs(attrs).finished
    done = {**attrs, **result_attrs(SPEC, ok_result()), "constraint": [-5.0], "worker": "h:cpu"}
    record = TrialRecord.from_attrs(done)
    assert record.fits() and record.worker == "h:cpu" and record.to_attrs() == done
    assert violation_of(done) == -5.0 and violation_of({}) == math.inf


def test_missing_attrs_read_as_defaults() -> None:
    record = TrialRecord.from_attrs({})
    assert record == TrialRecord()
    assert record.outcome is None and not record.finished and not record.measured
    assert record.outcome_label == "" and record.world_size == 1 and record.ranks == ()
    # an attr from a newer budgettune reads as unknown, and is shown as written
    newer = TrialRecord.from_attrs({"outcome": "from_a_newer_budgettune"})
    assert newer.outcome is None and newer.outcome_label == "from_a_newer_budgettune"
    # a stored null loss (SQLite's JSON for NaN) is non-finite; a missing loss is not
    assert TrialRecord.from_attrs({"outcome": "ok", "loss": None}).outcome is (
        TrialOutcome.NON_FINITE
    )
    assert TrialRecord.from_attrs({"outcome": "ok"}).outcome is TrialOutcome.OK


def _stored_trials(db: Path) -> list[dict[str, Any]]:
    """Every trial's user attrs, read straight from Optuna's table (no upgrade, read-only)."""
    connection = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        rows = connection.execute(
            "SELECT trial_id, key, value_json FROM trial_user_attributes"
        ).fetchall()
    finally:
        connection.close()
    trials: dict[int, dict[str, Any]] = defaultdict(dict)
    for trial_id, key, value in rows:
        trials[trial_id][key] = json.loads(value)
    return list(trials.values())


def _same(stored: Any, written: Any, key: str) -> bool:
    if key in ("spec", "enqueued_spec"):
        return TrialSpec.from_json_dict(stored) == TrialSpec.from_json_dict(written)
    if isinstance(stored, float) and math.isnan(stored):
        return isinstance(written, float) and math.isnan(written)
    return bool(stored == written)


def test_there_are_committed_studies_to_read() -> None:
    assert len(STUDY_DBS) >= 10


@pytest.mark.parametrize("db", STUDY_DBS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_study_reads_back_without_losing_an_attr(db: Path) -> None:
    trials = _stored_trials(db)
    assert trials
    for attrs in trials:
        record = TrialRecord.from_attrs(attrs)
        written = record.to_attrs()
        lost = sorted(key for key in attrs if key not in written)
        assert not lost, lost
        changed = sorted(key for key in attrs if not _same(attrs[key], written[key], key))
        assert not changed, changed
        if record.finished:
            assert record.outcome is not None, record.stored_outcome
