"""End-to-end searches on the CPU tiny GPT: real subprocess trials, real SQLite/PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from budgettune.cli import app

# Fast trials: codegen-free backend, one warm-up, two timed steps, two re-verifications.
FAST = [
    "--backend", "aot_eager_decomp_partition",
    "--warmup-steps", "1",
    "--timed-steps", "2",
    "--top-k", "2",
    "--reverify", "2",
    "--seed", "7",
    "--timeout", "300",
]  # fmt: skip
# Eager trials for what does not depend on the partitioner (storage, stops, interrupts): a
# compile is ~5 s of every CPU trial; budget 1.0 and full block AC peak as compiled ones do.
EAGER = [*FAST, "--fix", "compile_mode=eager"]
# tiny-gpt on torch 2.13 CPU peaks ~141 MB at budget 1.0 and ~100 MB at budget 0.2
# (tests/integration/test_trial_cli.py asserts that 0.2 is clearly lower); 125 MB lies between.
LIMIT = "125MB"
runner = CliRunner()
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _trials(storage: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials that ran or run (not the baselines still queued)."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    return [t for t in trials if t.state != optuna.trial.TrialState.WAITING]


def test_search_pins_a_config_under_the_limit_and_resumes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    pin_path = tmp_path / "best.json"
    # 3 trials, the opening's baselines (budget 0.5 fits); the resume below samples a 4th
    result = _invoke(
        "search", "--max-mem", LIMIT, "--trials", "3", "--storage", db, "--study", "s1",
        "--output", str(pin_path), "--json", *FAST, "--top-k", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    pin = json.loads(pin_path.read_text())
    assert json.loads(result.stdout) == pin  # --json: only the document on stdout
    assert pin["schema_version"] == 1
    assert pin["limit_bytes"] == 125_000_000
    # --top-k 1: the one candidate stands alone; it takes one fresh run when the runs are
    # quiet, both rounds on a noisy CPU host (issue 44: rounds sized by the noise), and at
    # least its first run started with empty compile caches, as a fresh host's job does (a
    # later one may too: aot_eager writes no inductor cache, so a shared folder stays empty)
    runs = pin["measured"]["runs"]
    assert runs in (1, 2) and 1 <= pin["measured"]["cold_runs"] <= runs
    assert pin["measured"]["peak_worst_bytes"] <= 125_000_000
    baseline = pin["baseline"]
    assert baseline["peak_bytes"] > 125_000_000  # the limit really constrains
    assert baseline["slowdown"] == pytest.approx(
        pin["measured"]["step_time_ms"] / baseline["step_time_ms"] - 1
    )
    # the baseline is re-measured as often as the pin (it is over the limit, so it is no
    # candidate): its step time is the median of those runs, the trial's figure kept beside
    assert baseline["runs"] == runs and baseline["trial_step_time_ms"] > 0
    assert pin["fingerprint"]["workload"]["param_count"] > 0
    trials = _trials(db, "s1")
    assert len(trials) == 3
    assert [t.user_attrs.get("baseline") for t in trials] == [
        "unconstrained",
        "block-ac-every-1",
        "budget-0.5",
    ]
    for t in trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert "constraint" in t.user_attrs and "outcome" in t.user_attrs
        if t.state == optuna.trial.TrialState.PRUNED:
            # does not fit: its value (the dashboard's history) is a step time, never bytes
            assert t.user_attrs["constraint"][0] > 0
            assert t.value == pytest.approx(t.user_attrs["step_time_ms"])
    assert trials[0].state == optuna.trial.TrialState.PRUNED  # the baseline, over the limit
    assert "trial 0: ok (does not fit)" in result.stderr  # the progress says so
    # every measurement is also in bt_measurements, re-verifications included
    with sqlite3.connect(tmp_path / "bt.db") as conn:
        kinds = dict(
            conn.execute("select kind, count(*) from bt_measurements group by kind").fetchall()
        )
        pins = conn.execute("select count(*) from bt_pins").fetchone()[0]
        per_trial = dict(
            conn.execute(
                "select trial_number, count(*) from bt_measurements where kind = 'reverify'"
                " group by trial_number"
            ).fetchall()
        )
    assert kinds["trial"] == 3 and pins == 1
    # re-measured: the candidate (budget 0.5, trial 2) and full block AC (trial 1), the
    # reference that fits, in the same rounds (issue 45: the pin is whichever ran faster
    # fresh, the lighter where the runs cannot tell them apart), and the unconstrained
    # baseline (trial 0, over the limit) as often as the pin, for the report
    assert pin["baseline_status"] == "over_limit" and pin["trial_number"] in (1, 2)
    assert pin["baseline"]["runs"] == runs and 1 <= pin["full_ac"]["runs"] <= runs
    assert sum(per_trial.values()) == kinds["reverify"]
    assert {0, 1, pin["trial_number"]} <= set(per_trial) <= {0, 1, 2}  # 2: when it led
    assert per_trial[pin["trial_number"]] == runs

    # running it again adds trials to the same study
    again = _invoke(
        "search", "--max-mem", LIMIT, "--trials", "1", "--storage", db, "--study", "s1",
        "--output", str(pin_path), *FAST, "--top-k", "1",
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert len(_trials(db, "s1")) == 4

    # --trials 0 runs no trial: it re-verifies (reusing the stored runs) and pins again
    def reverify_runs() -> int:
        with sqlite3.connect(tmp_path / "bt.db") as conn:
            q = "select count(*) from bt_measurements where kind = 'reverify'"
            return int(conn.execute(q).fetchone()[0])

    stored = reverify_runs()
    study = optuna.load_study(study_name="s1", storage=db)
    target = study.user_attrs["target_trials"]
    study.ask()  # a trial left RUNNING, as by a process that died: --trials 0 runs nothing
    pinned = _invoke(
        "search", "--max-mem", LIMIT, "--trials", "0", "--storage", db, "--study", "s1",
        "--output", str(tmp_path / "again.json"), *FAST, "--top-k", "1",
    )  # fmt: skip
    assert pinned.exit_code == 0, pinned.output
    after = optuna.load_study(study_name="s1", storage=db)
    assert after.user_attrs["target_trials"] == target  # other workers' target left be
    assert len([t for t in _trials(db, "s1") if t.state.is_finished()]) == 4
    assert reverify_runs() == stored
    assert (
        json.loads((tmp_path / "again.json").read_text())["trial_number"]
        == json.loads(pin_path.read_text())["trial_number"]
    )
    missing = _invoke(
        "search", "--max-mem", LIMIT, "--trials", "0", "--storage", db, "--study", "nope", *FAST
    )
    assert missing.exit_code == 2 and "holds no study 'nope'" in missing.stderr
    assert "nope" not in optuna.get_all_study_names(db)

    shown = _invoke("show", "--storage", db)
    assert shown.exit_code == 0, shown.output
    assert "Pareto" in shown.stdout and "[unconstrained]" in shown.stdout
    # issue 44: where the study's time went, every process by phase (in each trial's attrs too)
    table = _invoke("show", "--storage", db, "--phases")
    assert table.exit_code == 0, table.output
    assert "processes" in table.stdout and "compile" in table.stdout and "share" in table.stdout
    runs = json.loads(_invoke("show", "--storage", db, "--phases", "--json").stdout)["runs"]
    assert {r["kind"] for r in runs} == {"trial", "reverify"}
    assert all(r["phases_s"]["compile"] > 0 for r in runs if r["outcome"] == "ok")
    assert all(sum(r["phases_s"].values()) == pytest.approx(r["wall_s"], abs=0.01) for r in runs)
    assert set(trials[0].user_attrs["phases_s"]) >= {"start", "imports", "compile", "exit"}
    exported = _invoke("export", "--storage", db, "--output", str(tmp_path / "exported.json"))
    assert exported.exit_code == 0, exported.output
    assert json.loads((tmp_path / "exported.json").read_text())["schema_version"] == 1

    # issue 47: the README's lines after a search, run as written (BUDGETTUNE_STORAGE, which
    # every command reads, names this study's store, as the README's team section sets it)
    for line in (
        "budgettune workloads",
        "budgettune show",
        "budgettune export --output best.json",
        "budgettune verify best.json",
    ):
        assert line in README, line
        done = runner.invoke(app, shlex.split(line)[1:], env={"BUDGETTUNE_STORAGE": db})
        assert done.exit_code == 0, (line, done.output)
    plotted = runner.invoke(app, ["show", "--plot", "study.png"], env={"BUDGETTUNE_STORAGE": db})
    assert plotted.exit_code == 0 and "wrote study.png" in plotted.stderr, plotted.output
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        json.loads((tmp_path / "best.json").read_text())["trial_number"]
        == json.loads(pin_path.read_text())["trial_number"]
    )


def test_search_against_postgres(pg_url: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _invoke(
        "search", "--max-mem", LIMIT, "--trials", "2", "--storage", pg_url, "--study", "pg",
        "--output", str(tmp_path / "pg.json"), *EAGER, "--top-k", "1", "--reverify", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(_trials(pg_url, "pg")) == 2
    assert json.loads((tmp_path / "pg.json").read_text())["measured"]["runs"] == 1


def test_limit_nothing_can_meet_exits_3_and_names_the_smallest_peak(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    result = runner.invoke(
        app,
        ["search", "--max-mem", "60MB", "--trials", "2", "--storage", db, *EAGER],
    )
    assert result.exit_code == 3, result.output
    assert "smallest peak seen is" in result.stderr
    assert len(_trials(db, optuna.get_all_study_names(db)[0])) == 2  # trials kept


def test_limit_below_steady_memory_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    args = ["search", "--max-mem", "20MB", "--trials", "3", "--storage", db, *EAGER]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "steady memory" in result.stderr
    names = optuna.get_all_study_names(db)
    assert len(_trials(db, names[0])) == 1  # stopped after the baseline, which is kept
    # a second run says so before spending a trial
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "steady memory" in again.stderr
    assert len(_trials(db, names[0])) == 1


def test_interrupted_search_keeps_finished_trials_and_resumes(tmp_path: Path) -> None:
    db_file = tmp_path / "bt.db"
    db = f"sqlite:///{db_file}"
    command = [
        sys.executable, "-m", "budgettune.cli", "search", "--max-mem", LIMIT, "--trials", "6",
        "--storage", db, "--study", "int", *EAGER,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    states: list[str] = []
    while time.monotonic() < deadline:
        time.sleep(1.0)
        # Read the file directly: opening it through Optuna while the search is still creating
        # the tables would race it (both would try to create them).
        try:
            with sqlite3.connect(f"file:{db_file}?mode=ro", uri=True) as conn:
                states = [row[0] for row in conn.execute("select state from trials")]
        except sqlite3.OperationalError:  # no file or no tables yet
            states = []
        if "COMPLETE" in states and "RUNNING" in states:
            break
    finished = [state for state in states if state == "COMPLETE"]
    assert finished, "no trial finished in time"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted; finished work is kept"
    trials = _trials(db, "int")
    states = [t.state for t in trials]
    assert optuna.trial.TrialState.RUNNING not in states
    assert states.count(optuna.trial.TrialState.FAIL) == 1
    complete_before = states.count(optuna.trial.TrialState.COMPLETE)
    assert complete_before >= 1
    # the interrupted trial is queued again, as Optuna re-queues a dead worker's trial
    [failed] = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    queued = optuna.load_study(study_name="int", storage=db).get_trials(
        states=(optuna.trial.TrialState.WAITING,)
    )
    assert [t.system_attrs.get("retry_history") for t in queued].count([failed.number]) == 1
    # no orphaned trial process
    leftover = subprocess.run(
        ["pgrep", "-f", f"budgettune.trial.child {tmp_path}"], capture_output=True, text=True
    )
    assert leftover.stdout.strip() == ""
    # resume: a second run adds trials to the same study, the interrupted one among them (one
    # fresh run of one candidate: the pin is not what this test is about)
    again = subprocess.run(
        [*command[:command.index("--trials") + 1], "2", *command[command.index("--trials") + 2:],
         "--top-k", "1", "--reverify", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode in (0, 3), again.stderr
    after = _trials(db, "int")
    assert len(after) == len(trials) + 2
    # issue 29: interrupted during a baseline of the opening, the study still measures it
    measured = {t.user_attrs.get("baseline") for t in after if "outcome" in t.user_attrs}
    assert {"unconstrained", "block-ac-every-1", "budget-0.5"} <= measured, measured


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--max-mem", "banana"], "not a byte size"),
        (["--max-mem", "0"], "must be positive"),
        (["--max-mem", "-5GB"], "not a byte size"),
        (
            ["--max-mem", "1GB", "--storage", "postgresql://postgres@127.0.0.1:1/test"],
            "cannot connect",
        ),
        (["--max-mem", "1GB", "--workload", "nope.py:build"], "nope.py"),
        (["--max-mem", "1GB", "--fix", "colour=red"], "unknown dimension"),
        (["--max-mem", "1GB", "--modes", "turbo"], "unknown value"),
        (["--max-mem", "1GB", "--device", "cuda"], "no CUDA GPU"),
        (["--max-mem", "1GB", "--remove-ops", "aten.add,aten.bogus"], "unknown op 'aten.bogus'"),
    ],
)
def test_bad_search_input_is_one_line_nonzero_and_touches_nothing(
    tmp_path, monkeypatch, args, fragment
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["search", *args])
    assert result.exit_code != 0
    assert fragment in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "budgettune.db").exists()


def test_study_file_with_unknown_key(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "s.toml"
    study.write_text('max_mem = "1GB"\ntrails = 3\n')
    result = runner.invoke(app, ["search", str(study)])
    assert result.exit_code == 2 and "unknown key 'trails'" in result.stderr
    assert not (tmp_path / "budgettune.db").exists()


def test_newer_schema_database_is_refused_and_left_alone(tmp_path, monkeypatch) -> None:
    from budgettune import storage

    monkeypatch.chdir(tmp_path)
    db_file = tmp_path / "bt.db"
    storage.open_storage(str(db_file)).close()
    with sqlite3.connect(db_file) as conn:
        conn.execute("update budgettune_alembic_version set version_num = '9999'")
    before = db_file.read_bytes()
    result = runner.invoke(app, ["search", "--max-mem", "1GB", "--storage", str(db_file)])
    assert result.exit_code == 1 and "newer budgettune" in result.stderr
    shown = runner.invoke(app, ["show", "--storage", str(db_file)])
    assert shown.exit_code == 1 and "newer budgettune" in shown.stderr
    assert db_file.read_bytes() == before


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{corrupt", "not a readable pinned config"),
        ('{"schema_version": 7, "spec": {}}', "schema version 7"),
    ],
)
def test_verify_rejects_corrupt_or_foreign_pins(tmp_path, content, fragment) -> None:
    path = tmp_path / "pin.json"
    path.write_text(content)
    result = runner.invoke(app, ["verify", str(path)])
    assert result.exit_code == 2 and fragment in result.stderr


def test_real_cli_subprocess_help_documents_exit_codes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "budgettune.cli", "search", "--help"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0
    # the installed console script of this interpreter's environment (no PATH needed: the
    # README's test command runs .venv/bin/python without activating the venv)
    script = Path(sys.executable).parent / "budgettune"
    top = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert "Exit codes" in top.stdout and re.search(r"\b3\s+no configuration fits", top.stdout)
    assert re.search(r"\b4\s+no trial could be measured at all", top.stdout)
    assert "143" in top.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--budget", "1.5"], "within [0, 1]"),
        (["--remove-op", "aten.nope"], "unknown op 'aten.nope'"),
        (["--solver", "magic"], "unknown knapsack_solver"),
        (["--estimator", "guess"], "unknown runtime_estimator"),
        (["--mode", "turbo"], "unknown compile_mode"),
        (["--device", "cuda"], "no CUDA GPU"),
        (["--workload", "missing.py:build"], "missing.py"),
    ],
)
def test_bad_trial_input_is_one_line_and_spends_no_trial(tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["trial", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "budgettune-runs").exists()
