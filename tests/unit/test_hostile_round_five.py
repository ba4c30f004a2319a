"""Issue 48, the ninth hostile probe's findings (benchmarks/results/cpu-hostile-probe-2026-11-28/
findings-9.md): each case fails before its fix and passes after."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from storage_samples import pin_document, small_study
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import BudgettuneError, TrialInfrastructureError, UsageError, shown_value
from budgettune.integrations.trainer_workload import _MARKER, check_workload_folder
from budgettune.trial.launcher import launch_trial
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

runner = CliRunner()


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study with one finished trial, its search attrs as budgettune writes them."""
    attrs = {
        "search_spec": {"workload": "builtin:tiny-gpt"},
        "search": {"max_mem_bytes": 10**9, "mem_metric": "device"},
    }
    return small_study(tmp_path_factory.mktemp("db") / "s.db", attrs)


@pytest.mark.parametrize(
    ("key", "value"),
    [("search_spec", "[5]"), ("search_spec", '"x"'), ("search_spec", "true"), ("search", "null")],
)
@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["show", "--plot", "p.html"]])
def test_p9_1_p9_2_a_study_attr_that_is_no_object_is_read_as_missing(
    study_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    value: str,
    command: list[str],
) -> None:
    damaged = tmp_path / "d.db"
    with sqlite3.connect(study_db) as source, sqlite3.connect(damaged) as connection:
        source.backup(connection)
        connection.execute(
            "update study_user_attributes set value_json=? where key=?", (value, key)
        )
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*command, "--storage-url", f"sqlite:///{damaged}"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    if key == "search_spec":  # a worker finds no spec in it: one line, exit 2
        worker = runner.invoke(
            app,
            ["worker", "--storage-url", f"sqlite:///{damaged}", "--study-name", "s"]
            + ["--device", "cpu", "--max-trials", "1"],
        )
        assert worker.exit_code == 2, worker.output
        assert "holds no search spec" in worker.output


def test_p9_3_a_hard_link_planted_as_the_trial_log_is_not_written_through(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    folder = tmp_path / "run"
    folder.mkdir()
    os.link(victim, folder / "trial.log")
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu", cache_root=None)
    with pytest.raises(TrialInfrastructureError, match="hard link"):
        launch_trial(run, run_dir=folder, timeout_s=10)
    assert victim.read_text() == "victim\n"


def test_p9_4_write_workload_refuses_a_hard_link_in_its_own_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ours"
    folder.mkdir()
    (folder / "build.py").write_text(f'"""{_MARKER}"""\n')
    check_workload_folder(folder)  # its own folder: it may write there
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    os.link(victim, folder / "config.json")
    with pytest.raises(UsageError, match="hard link"):
        check_workload_folder(folder)


def test_p9_5_verify_refuses_an_unknown_op_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = TrialSpec(recompute_ops_added=("aten.not_an_op",))
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(pin_document(spec)), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        app, ["verify", "--pin", str(pin), "--device", "cpu", "--allow-other-workload"]
    )
    assert result.exit_code == 2, result.output
    assert "not_an_op" in result.output
    assert not list(tmp_path.glob("budgettune-runs/**/RESULT.json"))  # nothing ran


def _deep_list(depth: int = 3000) -> list[object]:
    """A list ``depth`` lists deep (its repr recurses past Python's limit)."""
    deep: list[object] = []
    cur = deep
    for _ in range(depth):
        nxt: list[object] = []
        cur.append(nxt)
        cur = nxt
    return deep


def test_p9_6_a_deeply_nested_value_is_one_bounded_line() -> None:
    import budgettune

    deep = _deep_list()
    assert len(shown_value(deep)) <= 80
    for keyword in ("top_k", "gpus", "options", "sampler", "margin"):
        with pytest.raises(BudgettuneError) as caught:
            budgettune.search("builtin:tiny-gpt", "1GB", **{keyword: deep})  # type: ignore[arg-type]
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    from budgettune.integrations.transformers import write_workload

    for trainer, folder in ((deep, "x"), (object(), deep)):  # the same in write_workload
        with pytest.raises(UsageError, match=r"\[\[\[\[\.\.\.\]\]\]\]"):
            write_workload(trainer, folder)  # type: ignore[arg-type]


def test_every_refusal_that_quotes_a_value_bounds_it_however_deep_it_nests() -> None:
    """The refusals that quoted ``{value!r:.40}`` built the whole repr first (a 3,000-deep
    list raised RecursionError there, as P9-6 found in budgettune.search): each now shows it
    with `shown_value`."""
    from budgettune.study.batch import micro_batch_sizes
    from budgettune.study.expressible import check_target
    from budgettune.trial.spec import TrialSpec
    from budgettune.workload_builtins import check_builtin_bounds

    deep = _deep_list()
    calls = [
        lambda: check_builtin_bounds("builtin:tiny-gpt", {"n_layers": deep}),
        lambda: check_builtin_bounds("builtin:tiny-gpt", {"seed": deep}),
        lambda: TrialSpec.from_json_dict({"recompute_ops_added": {"a": deep}}),
        lambda: TrialSpec.from_json_dict({"block_ac_every": deep}),
        lambda: check_target(deep),  # type: ignore[arg-type]
        lambda: micro_batch_sizes(deep, (0,), {}),
    ]
    for call in calls:
        with pytest.raises(BudgettuneError) as caught:
            call()
        assert "[[[...]]]" in str(caught.value) and "\n" not in str(caught.value)


def test_p9_7_an_empty_workload_or_run_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        app, ["search", "--workload", "", "--num-trials", "1", "--max-mem", "1GB"]
    )
    assert result.exit_code == 2 and "non-empty" in result.output, result.output
    result = runner.invoke(app, ["trial", "--device", "cpu", "--run-dir", ""])
    assert result.exit_code == 2 and "--run-dir" in result.output, result.output
    assert not (tmp_path / "SPEC.json").exists()
    assert not (tmp_path / "budgettune.db").exists()


def test_p9_8_a_newline_in_a_path_stays_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        app,
        ["search", "--num-trials", "0", "--max-mem", "1GB"]
        + ["--storage-url", f"sqlite:///{tmp_path}/a\nb.db"],
    )
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "a\\nb.db" in result.output
    result = runner.invoke(app, ["search", str(tmp_path / "s\nt.toml"), "--num-trials", "1"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_p9_9_a_file_that_is_no_database_is_refused_with_nothing_beside_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    user = tmp_path / "user.toml"
    user.write_text("x = 1\n")
    result = runner.invoke(
        app,
        ["search", "--num-trials", "1", "--max-mem", "1GB", "--storage-url", f"sqlite:///{user}"],
    )
    assert result.exit_code == 2 and "not a database" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.toml"]
    assert user.read_text() == "x = 1\n"


@pytest.mark.parametrize("gpus", ["１２", "١٢", "1_000", "+3", "-1", "--1"])
def test_p9_10_gpu_indices_are_ascii_digits(gpus: str) -> None:
    result = runner.invoke(
        app, ["search", "--gpus", gpus, "--num-trials", "1", "--max-mem", "1GB"]
    )
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("value", ['{"a": 1}', '"x"'])
def test_p10_2_a_damaged_stored_spec_is_unreadable_data_not_bad_input(
    study_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """The tenth probe: a trial's stored ``spec`` edited by hand exited 2 with "unknown
    TrialSpec key(s)", as if the user had typed it; it is a damaged row (exit 1, one line)."""
    damaged = tmp_path / "d.db"
    with sqlite3.connect(study_db) as source, sqlite3.connect(damaged) as connection:
        source.backup(connection)
        connection.execute(
            "update trial_user_attributes set value_json=? where key='spec'", (value,)
        )
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["show", "--storage-url", f"sqlite:///{damaged}"])
    assert result.exit_code == 1, result.output
    assert "stored data cannot be read" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="no /proc")
def test_p9_11_an_output_whose_folder_takes_no_new_file_is_refused_before_the_work(
    tmp_path: Path,
) -> None:
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(pin_document(TrialSpec())), encoding="utf-8")
    result = runner.invoke(
        app, ["export", "--pin", str(pin), "--output", "/proc/self/fd/1", "--force"]
    )
    assert result.exit_code == 2, result.output
    assert "cannot write into /proc/self/fd" in result.output
