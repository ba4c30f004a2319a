"""Issue 14: a workload that fails before any knob can matter costs one trial and exit 1; a
limit that is certainly missing its unit is refused before any trial."""

from __future__ import annotations

import json
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


def test_a_workload_whose_loss_is_nan_ends_non_finite_and_exit_4(tmp_path: Path, monkeypatch):
    """Issue 29, items 4 and 7: never "ok", never the best, and not "raise --max-mem" (3)."""
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    result = runner.invoke(
        app,
        ["search", "-w", f"{FIXTURES / 'faulty_workloads.py'}:nan_loss", "--device", "cpu",
         "--max-mem", "1GB", "--trials", "1", "--storage", db, "--study", "nan", *FAST,
         "--top-k", "1", "--reverify", "1"],
    )  # fmt: skip
    assert result.exit_code == 4, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no trial could be measured"), lines
    assert "1 non_finite" in errors[0] and "first-step loss nan" in errors[0]
    assert "trial.log" in errors[0] and "--max-mem" in errors[0]  # "a larger --max-mem will not"
    assert any(line.startswith("trial 0: non_finite") for line in lines)  # the progress line
    [trial] = [
        t for t in optuna.load_study(study_name="nan", storage=db).trials
        if t.state != optuna.trial.TrialState.WAITING
    ]  # fmt: skip
    assert trial.state == optuna.trial.TrialState.PRUNED  # infeasible, like an OOM
    assert trial.user_attrs["outcome"] == "non_finite" and "loss" not in trial.user_attrs
    shown = runner.invoke(app, ["show", "--storage", db, "--study", "nan"])
    assert shown.exit_code == 0, shown.output
    assert "non_finite" in shown.stdout and "no feasible trial yet" in shown.stdout
    report = json.loads(runner.invoke(app, ["show", "--storage", db, "--json"]).stdout)
    assert [(r["outcome"], r["feasible"]) for r in report["rows"] if r["state"] != "WAITING"] == [
        ("non_finite", False)
    ]
    assert report["best"] is None and report["baseline_status"] == "non_finite"


def test_a_run_folder_replaced_mid_search_stops_in_one_line_and_excludes_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    """Issue 29, item 5: the runs folder becomes a file while the full block-AC baseline runs
    (`faulty_workloads.breaks_its_folder`): no traceback, block AC not "excluded after
    crashes", and the baseline is queued to run again."""
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    result = runner.invoke(
        app,
        ["search", "-w", f"{FIXTURES / 'faulty_workloads.py'}:breaks_its_folder",
         "--device", "cpu", "--max-mem", "1GB", "--trials", "2", "--storage", db,
         "--study", "fs", "--runs-dir", str(tmp_path / "runs"), *FAST],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: trial 1: a trial could not use")
    assert str(tmp_path / "runs" / "fs") in errors[0] and "nothing is excluded" in errors[0]
    assert not any("Traceback" in line or "excluded:" in line for line in lines), lines
    study = optuna.load_study(study_name="fs", storage=db)
    assert "excluded" not in study.user_attrs
    states = {t.number: t.state.name for t in study.trials}
    assert (states[0], states[1]) == ("COMPLETE", "FAIL")
    [copy] = [t for t in study.trials if t.system_attrs.get("retry_history") == [1]]
    assert copy.state == optuna.trial.TrialState.WAITING
    assert copy.user_attrs["baseline"] == "block-ac-every-1"
