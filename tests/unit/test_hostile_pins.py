"""Issue 48: a hostile or corrupt pin is one line and exit 2 in every reader (`load_pinned`,
`export` in each format, `verify`), never a traceback; every figure passes bounds before use;
a corrupt pin row in the study's database does not crash `show` or `export`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from budgettune import storage
from budgettune.cli import app
from budgettune.errors import PinnedConfigError
from budgettune.pinning import load_pinned
from budgettune.trial.spec import TrialSpec

runner = CliRunner()
GOOD: dict[str, Any] = {
    "schema_version": 1,
    "spec": TrialSpec(compile_mode="eager").to_json_dict(),
    "workload": "builtin:tiny-gpt",
    "limit_bytes": 125_000_000,
    "mem_metric": "device",
    "measured": {"runs": 1, "peak_worst_bytes": 100_000_000, "step_time_ms": 10.0},
}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE: list[tuple[str, str]] = [
    ("baseline-str", json.dumps({**GOOD, "baseline": "x"})),
    ("baseline-list", json.dumps({**GOOD, "baseline": [1]})),
    ("split-list", json.dumps({**GOOD, "measured": {**GOOD["measured"], "split": [1]}})),
    ("per-rank-str", json.dumps({**GOOD, "measured": {**GOOD["measured"], "per_rank": "x"}})),
    ("peak-inf", json.dumps(GOOD).replace("100000000", "1e400")),
    ("trial-inf", json.dumps({**GOOD, "trial_number": 1}).replace('"trial_number": 1',
                                                                 '"trial_number": 1e400')),
    ("huge-int", json.dumps(GOOD).replace("100000000", "9" * 5000)),
    ("deep", json.dumps(GOOD)[:-1] + ', "extra": ' + _nested(5000) + "}"),
    ("limit-huge", json.dumps({**GOOD, "limit_bytes": 10**400})),
    ("world-huge", json.dumps({**GOOD, "world_size": 10**6})),
    ("ms-nan", json.dumps(GOOD).replace("10.0", "NaN")),
    ("options-list", json.dumps({**GOOD, "workload_options": [1]})),
    ("unknown-change", json.dumps({**GOOD, "model_changes": ["rm -rf /"]})),
    # P7 of the fourth probe: the rest of the fields a reader uses
    ("fp-cuda-list", json.dumps({**GOOD, "fingerprint": {"cuda_version": [1]}})),
    ("fp-device-escape", json.dumps({**GOOD, "fingerprint": {"device_name": "\x1b[2JEVIL"}})),
    ("fp-workload-str", json.dumps({**GOOD, "fingerprint": {"workload": "x"}})),
    ("fp-digest-list", json.dumps({**GOOD, "fingerprint": {"workload": {"digest": [1]}}})),
    ("range-three", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                    "step_time_range_ms": [1, 2, 3]}})),
    ("range-words", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                    "step_time_range_ms": ["a", "b"]}})),
    ("per-rank-ints", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                      "per_rank": [1, 2]}})),
    ("per-rank-words", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                       "per_rank": [{"rank": "x"}]}})),
    ("per-rank-huge", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                      "per_rank": [{"rank": 10**7}]}})),
    ("range-reversed", json.dumps({**GOOD, "measured": {**GOOD["measured"],
                                                       "step_time_range_ms": [2, 1]}})),
    ("fp-batch-str", json.dumps({**GOOD, "fingerprint": {"workload": {"batch": "x"}}})),
    ("schema-true", json.dumps({**GOOD, "schema_version": True})),
    ("spec-empty", json.dumps({**GOOD, "spec": {}})),
]  # fmt: skip


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    """The CLI's working folder (tests/conftest.py); its ``bt.db`` is an empty study database."""
    return cli_workdir


@pytest.mark.parametrize(("name", "text"), HOSTILE, ids=[n for n, _ in HOSTILE])
def test_a_hostile_pin_is_one_line_in_every_reader(workdir: Path, name: str, text: str) -> None:
    path = workdir / "pin.json"
    path.write_text(text)
    with pytest.raises(PinnedConfigError) as caught:
        load_pinned(path, apply_allocator=False)
    said = str(caught.value).replace(str(path), "pin.json")
    assert "\n" not in said and len(said) < 600, said
    for args in (
        ["export", "--pin", "pin.json", "-o", "out.json"],
        ["export", "--pin", "pin.json", "--format", "env"],
        ["export", "--pin", "pin.json", "--format", "torchtitan"],
        ["verify", "pin.json"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output, (args, result.stderr)
    assert not (workdir / "out.json").exists()


def test_a_corrupt_pin_row_in_the_study_does_not_crash_show_or_export(workdir: Path) -> None:
    url = f"sqlite:///{workdir / 'bt.db'}"
    import optuna

    optuna.create_study(study_name="s", storage=url)
    with storage.open_storage(url) as store:
        store.record_pin(
            study_name="s", pin={**GOOD, "baseline": "x", "measured": {"split": [1]}},
            peak_bytes=1, step_time_ms=1.0, slowdown=None, limit_bytes=125_000_000,
            mem_metric="device",
        )  # fmt: skip
    shown = runner.invoke(app, ["show", "--storage", url, "--study", "s"])
    assert shown.exit_code == 0, (shown.output, shown.exception)
    assert "the study's stored pin" in shown.stdout
    exported = runner.invoke(app, ["export", "--storage", url, "--study", "s", "-o", "x.json"])
    assert exported.exit_code == 2, (exported.output, exported.exception)
    assert len(exported.stderr.strip().splitlines()) == 1
