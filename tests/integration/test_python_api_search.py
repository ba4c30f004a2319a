"""`budgettune.search(...)` from a script: it pins, resumes, and the job applies the pin
(`examples/from_python.py`, run as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState

EXAMPLE = Path(__file__).parents[2] / "examples" / "from_python.py"


def _run(cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "120MB", url],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_script_searches_pins_resumes_and_trains_with_the_pin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    first = _run(tmp_path, url)
    assert first.returncode == 0, first.stderr[-3000:]
    pin = json.loads((tmp_path / "from-python-pin.json").read_text())
    # the builder went to the trials by its file: the pin names it so
    assert pin["workload"] == f"{EXAMPLE.resolve()}:build", pin["workload"]
    assert pin["workload_options"] == {"n_layers": 2}
    assert "trained 2 steps with the pin" in first.stdout
    assert "trial 1:" in first.stderr  # the progress display's trial lines
    study = optuna.load_study(study_name="from-python", storage=url)
    assert study.user_attrs["target_trials"] == 2
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2
    again = _run(tmp_path, url)  # the same call resumes the same study
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="from-python", storage=url)
    assert study.user_attrs["target_trials"] == 4  # two more trials, in the same study
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 4
