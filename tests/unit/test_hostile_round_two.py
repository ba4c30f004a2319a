"""Issue 48's second hostile probe: each case failed before its fix."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import (
    PinnedConfigError,
    PinNoLongerFitsError,
    UsageError,
    WorkloadFailedError,
    terminal_safe,
)
from budgettune.pinning import check_pin_output, load_pinned
from budgettune.storage.engine import storage_files
from budgettune.study.verify import VerifyReport
from budgettune.trial.results import TrialOutcome, TrialResult


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal", ".claim-lock"])
def test_a_new_studys_database_and_journals_are_refused_before_they_exist(
    tmp_path: Path, suffix: str
) -> None:
    # `search --storage-url new.db --output new.db` replaced the new study with the pin
    database = tmp_path / "new.db"
    target = Path(f"{database}{suffix}")
    with pytest.raises(UsageError, match="name another file"):
        check_pin_output(target, protected=storage_files(f"sqlite:///{database}"))
    assert not target.exists()


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "huge"])
def test_a_pin_that_is_not_a_small_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    # `verify /dev/zero` grew to 22 GB; a FIFO blocked forever
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        path = tmp_path / "pin.fifo"
        os.mkfifo(path)
    elif kind == "folder":
        path = tmp_path
    else:
        path = tmp_path / "huge.json"
        with path.open("wb") as handle:
            handle.truncate(17 * 2**20)
    with pytest.raises(PinnedConfigError) as raised:
        load_pinned(path, warn=False, apply_allocator=False)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("path", [5, None, b"/tmp/pin.json", {"a": 1}])
def test_load_pinned_of_no_path_is_a_budgettune_error(path: object) -> None:
    with pytest.raises(PinnedConfigError, match="str or a Path"):
        load_pinned(path)  # type: ignore[arg-type]


def _db_with_pin_row(tmp_path: Path, text: str) -> Path:
    from budgettune import storage

    db = tmp_path / "r.db"
    store = storage.open_storage(f"sqlite:///{db}")
    import optuna

    optuna.create_study(study_name="s", storage=store.optuna_storage)
    store.record_pin(
        study_name="s",
        pin={"x": 1},
        peak_bytes=1,
        step_time_ms=1.0,
        slowdown=None,
        limit_bytes=1,
        mem_metric="device",
    )
    with sqlite3.connect(db) as conn:
        conn.execute("update bt_pins set pin_json = ?", (text,))
    return db


@pytest.mark.parametrize("text", ["", "[1]", "{", "1" * 5000, "[" * 5000 + "]" * 5000])
def test_a_stored_pin_row_that_is_no_json_object_is_one_line(tmp_path: Path, text: str) -> None:
    db = _db_with_pin_row(tmp_path, text)
    runner = CliRunner()
    url = f"sqlite:///{db}"
    shown = runner.invoke(app, ["show", "--storage-url", url, "--study-name", "s"])
    assert shown.exit_code == 0 and "Traceback" not in shown.output
    assert "stored pin of study 's'" in shown.output
    out = tmp_path / "o.json"
    exported = runner.invoke(app, ["export", "--storage-url", url, "--output", str(out)])
    assert exported.exit_code == 2 and not out.exists()
    assert len(exported.stderr.strip().splitlines()) == 1


def test_a_full_stdout_is_one_line(tmp_path: Path) -> None:
    pin = tmp_path / "missing.json"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "budgettune", "workloads"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1 and not pin.exists()
    assert done.stderr.strip().splitlines() == ["error: No space left on device"]


def _run(outcome: TrialOutcome) -> TrialResult:
    return TrialResult(outcome=outcome, error=f"it {outcome.value}")


def test_verify_exits_3_only_for_what_says_the_pin_no_longer_fits() -> None:
    def report(*outcomes: TrialOutcome) -> VerifyReport:
        return VerifyReport(
            path="p.json",
            limit_bytes=100,
            mem_metric="device",
            results=tuple(_run(o) for o in outcomes),
        )

    with pytest.raises(PinNoLongerFitsError):
        report(TrialOutcome.OOM).raise_if_over()
    # a crash or a timeout says nothing of the fit (issue 48: verify said "no longer fits")
    for outcome in (TrialOutcome.CRASHED, TrialOutcome.TIMEOUT):
        with pytest.raises(WorkloadFailedError) as raised:
            report(TrialOutcome.OOM, outcome).raise_if_over()
        assert raised.value.exit_code == 1
    json.dumps(report().to_json_dict())  # no runs, nothing to raise
    report().raise_if_over()


def test_a_study_file_with_a_huge_count_is_one_line(tmp_path: Path) -> None:
    from budgettune.errors import StudyFileError
    from budgettune.study.study_file import read_study_file

    study = tmp_path / "a.toml"
    study.write_text(
        'workload = "builtin:tiny-gpt"\nmax_mem = "125MB"\ntop_k = ' + "9" * 38 + "\n"
    )
    with pytest.raises((StudyFileError, UsageError)) as raised:
        read_study_file(study)
    assert "top_k" in str(raised.value) and "\n" not in str(raised.value)


def test_an_error_line_that_echoes_a_100_kb_input_is_bounded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / ('a' * 100_000)}.db"  # echoed as given: "no storage at URL"
    result = CliRunner().invoke(app, ["show", "--storage-url", url])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")  # the name is too long for the file system
    assert "characters left out" in result.stderr and len(result.stderr) < 2_000


def test_an_error_line_cannot_repaint_the_terminal() -> None:
    line = terminal_safe("study 'x\x1b[2J\x1b[31mred\x9b0m' has\tno trials\nsecond line")
    assert line == "study 'x\\x1b[2J\\x1b[31mred\\x9b0m' has\tno trials\nsecond line"


def _good_pin() -> dict[str, object]:
    return {
        "schema_version": 1,
        "spec": {"compile_mode": "eager"},
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 125_000_000,
        "mem_metric": "device",
        "study_name": "s1",
        "measured": {"runs": 1, "peak_worst_bytes": 100_000_000, "step_time_ms": 10.0},
    }


def test_output_dash_is_standard_output_not_a_file_named_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `export --output -` wrote a file named "-" (Unix tools read "-" as stdout)
    monkeypatch.chdir(tmp_path)
    pin = _good_pin()
    (tmp_path / "pin.json").write_text(json.dumps(pin))
    result = CliRunner().invoke(app, ["export", "--pin", "pin.json", "--output", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == pin  # the pin alone on stdout, as the file holds it
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", [["search", "--max-mem", "1GB"], ["db", "upgrade"]])
def test_another_programs_database_is_refused_with_nothing_left_beside_it(
    tmp_path: Path, command: list[str]
) -> None:
    database = tmp_path / "other.db"
    with sqlite3.connect(database) as conn:
        conn.execute("create table foo (x)")
    before = database.read_bytes()
    result = CliRunner().invoke(app, [*command, "--storage-url", f"sqlite:///{database}"])
    assert result.exit_code == 2 and "another program's database" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no .claim-lock
    assert database.read_bytes() == before


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"spec": []}, "spec: it must be a JSON object"),  # was read as the default spec
        ({"spec": {"seed": 10**400}}, "seed must be an integer from 0 to"),
        ({"spec": {"block_ac_every": 10**30}}, "block_ac_every must be an integer from 0 to"),
        ({"measured": {"runs": 1, "peak_worst_bytes": -5}}, "peak_worst_bytes is -5"),
        ({"study_name": "s1\n\x1b[2Jinjected"}, "study_name"),
        ({"spec": {"recompute_ops_added": "aten.mm"}}, "must be a list of op names"),
        ({"sharding": "fsdp2\n[job]\ninjected = 1"}, "sharding"),  # N7: it was never read
        ({"sharding": 5}, "sharding"),
        ({"sharding": "x" * 1001}, "sharding"),
        ({"advice": "\x1b[2J\x1b[31mEVIL"}, "advice"),  # probe 4, P7: show printed it raw
        ({"advice": "\ud800"}, "advice"),  # P6: a lone surrogate made show print a traceback
        ({"advice": ["x"]}, "advice"),
        ({"baseline_status": "great"}, "baseline_status"),
        ({"created_at": 5}, "created_at"),
    ],
)
def test_a_pin_field_out_of_its_bounds_is_one_line(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    path = tmp_path / "pin.json"
    path.write_text(json.dumps({**_good_pin(), **change}))
    with pytest.raises(PinnedConfigError, match=said.replace("[", r"\[")):
        load_pinned(path, warn=False, apply_allocator=False)


def test_the_good_pin_of_these_cases_loads(tmp_path: Path) -> None:
    path = tmp_path / "pin.json"
    path.write_text(json.dumps(_good_pin()))
    assert load_pinned(path, warn=False, apply_allocator=False).spec.compile_mode == "eager"


@pytest.mark.parametrize("listed", [("foreach", "foreach"), ("foreach", "fused")])
def test_an_optimizer_list_without_as_written_or_with_repeats_is_no_traceback(
    listed: tuple[str, ...],
) -> None:
    # the third probe: --optimizer-impls foreach,fused (or foreach,foreach) crashed in Optuna
    # ("'as_written' not in ('foreach', 'fused')") when the baseline, as written, was queued
    import optuna

    from budgettune.study.space import SearchSpace, spec_params, suggest_spec
    from budgettune.trial.spec import TrialSpec

    space = SearchSpace(optimizer_impls=listed, knapsack_solvers=("dp",))
    assert space.optimizer_impls == tuple(dict.fromkeys(listed))  # each once, in order
    baseline = TrialSpec(optimizer_impl="as_written")
    study = optuna.create_study()
    study.enqueue_trial(spec_params(baseline, space))
    trial = study.ask()
    drawn = suggest_spec(trial, space, TrialSpec())  # as spec_for does for a baseline
    assert drawn.optimizer_impl in listed


@pytest.mark.parametrize(
    "command", [["show"], ["export", "-o", "x.json"], ["worker", "--study-name", "s"]]
)
def test_another_programs_studies_table_is_refused_by_the_readers(
    tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the third probe: a table named "studies" that is not Optuna's gave three chained
    # tracebacks in show, export and worker (db upgrade refused it in one line)
    monkeypatch.chdir(tmp_path)
    database = tmp_path / "other.db"
    with sqlite3.connect(database) as conn:
        conn.execute("create table studies (a, b)")
    before = database.read_bytes()
    result = CliRunner().invoke(app, [*command, "--storage-url", f"sqlite:///{database}"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "another program's database (it holds studies" in result.stderr
    assert database.read_bytes() == before


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_an_in_memory_storage_is_refused(url: str) -> None:
    # the third probe: accepted, the study gone at exit (and once "exited without a result")
    result = CliRunner().invoke(app, ["search", "--max-mem", "1GB", "--storage-url", url])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {url} is an in-memory database")


def test_a_cpu_trial_with_the_profile_estimator_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    # the third probe: the trial process started, then crashed ("needs CUDA"), exit 1
    result = CliRunner().invoke(
        app,
        ["trial", "--runtime-estimator", "profile", "--device", "cpu",
         "--run-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 2 and "needs CUDA" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["maybe", "no", 1])
def test_a_flag_option_given_anything_but_true_or_false_is_refused(value: object) -> None:
    # the third probe: -o tie_embeddings=maybe built the model with tied embeddings ("maybe"
    # is a true string), exit 0
    import torch

    from budgettune.errors import WorkloadError
    from budgettune.workload import load_workload

    with pytest.raises(WorkloadError, match="option tie_embeddings takes true or false"):
        load_workload("builtin:tiny-gpt", torch.device("cpu"), {"tie_embeddings": value})


@pytest.mark.parametrize("knob", ["block_ac_every", "offload_every"])
def test_a_stride_past_the_last_block_says_it_reaches_none(knob: str) -> None:
    """N5: ``--block-ac-every 1000000`` ran as no block AC without a word."""
    from torch import nn

    from budgettune.trial.recompute import apply_to_blocks
    from budgettune.trial.spec import TrialSpec

    def two_blocks() -> nn.Sequential:
        return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    model = two_blocks()
    with pytest.warns(UserWarning, match=rf"{knob}=1000000 reaches no block: the model has 2"):
        apply_to_blocks(model, TrialSpec(**{knob: 1_000_000}), list(model), "cpu", how="blocks=")
    model = two_blocks()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stride that reaches a block: not a word
        apply_to_blocks(model, TrialSpec(**{knob: 2}), list(model), "cpu", how="blocks=")
