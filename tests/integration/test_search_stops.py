"""Issue 14: a workload that fails before any knob can matter costs one trial and exit 1; a
limit that is certainly missing its unit is refused before any trial."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from budgettune.cli import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAST = ["--backend", "aot_eager_decomp_partition", "--warmup-steps", "1", "--timed-steps", "1"]
runner = CliRunner()


@pytest.mark.parametrize(
    ("ref", "said"),
    [
        (f"{FIXTURES / 'faulty_workloads.py'}:raises", "ValueError: bad hidden size 7"),
        (f"{FIXTURES / 'faulty_workloads.py'}:not_a_workload", "returned int, not a"),
        (f"{FIXTURES / 'broken_import.py'}:build", "ModuleNotFoundError"),
    ],
)
def test_a_workload_that_cannot_be_loaded_costs_one_trial_and_exits_1(
    tmp_path: Path, monkeypatch, ref: str, said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    result = runner.invoke(
        app,
        ["search", "-w", ref, "--device", "cpu", "--max-mem", "1GB", "--trials", "6",
         "--storage", db, "--study", "broken", *FAST],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: trial 0: the workload"), lines
    assert said in errors[0] and "could not be loaded" in errors[0] and "trial.log" in errors[0]
    assert sum(line.startswith("trial ") for line in lines) == 1  # one trial, not six
    trials = optuna.load_study(study_name="broken", storage=db).trials
    ran = [t for t in trials if t.state != optuna.trial.TrialState.WAITING]
    assert len(ran) == 1 and ran[0].state == optuna.trial.TrialState.FAIL  # kept in the study
    assert ran[0].user_attrs["failed_stage"] == "workload"  # `show` and the dashboard can tell


def test_a_limit_without_its_unit_is_refused_before_any_trial(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "study.toml"
    study.write_text('workload = "builtin:tiny-gpt"\ndevice = "cpu"\nmax_mem = 120\n')
    result = runner.invoke(app, ["search", str(study), "--storage", str(tmp_path / "bt.db")])
    assert result.exit_code == 2, result.output
    assert "120 bytes is certainly missing its unit" in result.stderr
    assert "120GB or 120MB" in result.stderr
    assert not (tmp_path / "bt.db").exists()
