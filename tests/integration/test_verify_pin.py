"""Issue 29: `budgettune verify PIN` runs code the pin names, so it says which before running,
refuses a workload file that does not exist, and refuses a pin whose workload is not the one
it was measured on (the fingerprint the first run reports differs). The pins carry the real
fingerprint of `tests/fixtures/user_workload.py:build`; one real trial subprocess."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.study import verify as verify_mod
from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PINNED_ON = f"{FIXTURES / 'user_workload.py'}:build"
runner = CliRunner()
MEASURED = Measurement(
    peak_allocated_bytes=10**6, peak_reserved_bytes=10**6, peak_device_bytes=10**6,
    steady_bytes=10**5, phase_peak_bytes={"backward": 10**6}, peak_phase="backward",
    step_time_ms=1.0, step_time_p10_ms=1.0, step_time_p90_ms=1.0, compile_s=1.0,
    loss=1.0, grad_norm=1.0,
)  # fmt: skip


@pytest.fixture(scope="module")
def pinned_fingerprint() -> dict[str, Any]:
    """What a trial of the pinned workload records (the child's own function, run here)."""
    import torch

    from budgettune.workload import fingerprint, load_workload

    return fingerprint(load_workload(PINNED_ON, torch.device("cpu"))).to_json_dict()


def _pin(path: Path, workload: str, fingerprint: dict[str, Any] | None) -> Path:
    spec = TrialSpec(compile_backend="aot_eager_decomp_partition", warmup_steps=1, timed_steps=1)
    document = {
        "schema_version": 1,
        "workload": workload,
        "workload_options": {},
        "device": "cpu",
        "spec": spec.to_json_dict(),
        "limit_bytes": 10**9,
        "mem_metric": "device",
        "world_size": 1,
        "fingerprint": {"torch_version": "", "workload": fingerprint or {}},
    }
    path.write_text(json.dumps(document))
    return path


def test_verify_refuses_a_pin_edited_to_name_another_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_fingerprint: dict[str, Any]
) -> None:
    monkeypatch.chdir(tmp_path)
    # as in the issue: a relative path climbing out of the working directory
    other = os.path.relpath(FIXTURES / "other_workload.py", tmp_path)
    pin = _pin(tmp_path / "best.json", f"{other}:build", pinned_fingerprint)
    result = runner.invoke(app, ["verify", str(pin), "--runs", "3", "--timeout", "300"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (
        f"verify: importing the workload build from the file "
        f"{FIXTURES / 'other_workload.py'}, as {pin} says"
    )
    assert lines[1] == "run 1/3: ok"  # it ran, and its figures would have "fit"
    assert len(lines) == 3 and lines[2].startswith(f"error: {pin}: {other}:build is not the")
    assert f"(pinned on {pinned_fingerprint['param_count']} params" in lines[2]
    assert "--allow-other-workload" in lines[2]
    runs = sorted(p.name for p in (tmp_path / "budgettune-runs").glob("verify-*/run-*"))
    assert runs == ["run-0"]  # stopped before the other two


def test_verify_refuses_a_missing_workload_file_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_fingerprint: dict[str, Any]
) -> None:
    monkeypatch.chdir(tmp_path)
    pin = _pin(tmp_path / "best.json", "../../somewhere/evil.py:build", pinned_fingerprint)
    result = runner.invoke(app, ["verify", str(pin)])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "error: workload file ../../somewhere/evil.py not found (reference "
        "'../../somewhere/evil.py:build'): the pin names its workload file relative to the "
        "folder the search ran in"
    )
    assert not (tmp_path / "budgettune-runs").exists()


def test_verify_refuses_a_pin_without_a_workload_fingerprint_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    pin = _pin(tmp_path / "best.json", PINNED_ON, None)
    result = runner.invoke(app, ["verify", str(pin)])
    assert result.exit_code == 2
    assert "records no workload fingerprint" in result.stderr
    assert "--allow-other-workload" in result.stderr
    assert not (tmp_path / "budgettune-runs").exists()


def test_allow_other_workload_measures_every_run_and_says_how_it_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_fingerprint: dict[str, Any]
) -> None:
    """The flag's path, with the launcher replaced: what a run of another workload returns."""
    launched: list[Path] = []
    other = {**pinned_fingerprint, "param_count": 1234567, "digest": "0f1e2d"}

    def launch(run: Any, *, run_dir: Path, timeout_s: float, servers: Any = None) -> TrialResult:
        launched.append(run_dir)
        return TrialResult(
            outcome=TrialOutcome.OK, measurement=MEASURED, workload_fingerprint=other
        )

    monkeypatch.setattr(verify_mod, "launch_trial", launch)
    pin = _pin(tmp_path / "best.json", PINNED_ON, pinned_fingerprint)
    started: list[str] = []
    report = verify_mod.verify_pin(
        pin, runs=2, device="cpu", timeout_s=60, run_dir=tmp_path / "runs",
        allow_other_workload=True, on_start=started.append,
    )  # fmt: skip
    assert len(launched) == 2 and len(report.results) == 2
    assert started == [f"verify: importing the workload build from the file "
                       f"{FIXTURES / 'user_workload.py'}, as {pin} says"]  # fmt: skip
    assert report.workload_mismatch.startswith("workload 1234567 params")
    assert report.to_json_dict()["workload_mismatch"] == report.workload_mismatch
    with pytest.raises(verify_mod.WorkloadMismatchError):
        verify_mod.verify_pin(pin, runs=2, device="cpu", timeout_s=60, run_dir=tmp_path / "again")
    assert len(launched) == 3  # without the flag: one run, then the refusal
