"""Issue 48's P6-2: rows of a study database that budgettune did not write (edited by hand,
or damaged) are one line and a non-zero exit in every reader, not a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from storage_samples import small_study
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.storage.unreadable import unreadable_data

BREAKS = {
    "trial attr not JSON": "update trial_user_attributes set value_json='{\"x\"' where key='spec'",
    "trial attr 5000 deep": "update trial_user_attributes set value_json='"
    + "[" * 5000
    + "]" * 5000
    + "' where key='spec'",
    "trial attr a word": "update trial_user_attributes set value_json='\"many\"' "
    "where key='step_time_ms'",
    "distribution not JSON": "update trial_params set distribution_json='{bad'",
    "state unknown": "update trials set state='EVIL'",
    "study attr not JSON": "update study_user_attributes set value_json='{garbage' "
    "where key='search_spec'",
    # the seventh probe: a value Optuna asserts on (P7-1), a constraint that is a word (P7-2)
    "trial value NULL": "update trial_values set value=NULL",
    "constraint a word": "update trial_system_attributes set value_json='\"x\"' "
    "where key='constraints'",
}


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study with one finished trial, made as budgettune makes its storage (no trial run)."""
    path = tmp_path_factory.mktemp("db") / "s.db"
    return small_study(path, {"search_spec": {"workload": "builtin:tiny-gpt"}})


@pytest.mark.parametrize("name", sorted(BREAKS))
@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["show", "--plot", "p.html"]])
def test_a_damaged_row_is_one_line_in_every_reader(
    study_db: Path, tmp_path: Path, name: str, command: list[str]
) -> None:
    damaged = tmp_path / "d.db"
    with sqlite3.connect(study_db) as source, sqlite3.connect(damaged) as connection:
        source.backup(connection)  # the database in WAL mode: its rows, not its main file
        connection.execute(BREAKS[name])
    command = [str(tmp_path / part) if part == "p.html" else part for part in command]
    result = CliRunner().invoke(app, [*command, "--storage", str(damaged), "--study", "s"])
    assert "Traceback" not in result.output + result.stderr
    if name == "constraint a word" and "--plot" not in command:
        assert result.exit_code == 0, result.output  # the table reads no constraint
        return
    assert result.exit_code != 0
    assert "stored data cannot be read" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_fault_outside_the_storage_keeps_its_traceback() -> None:
    try:
        {}["missing"]  # noqa: B018 - a KeyError raised here, not in a storage reader
    except KeyError as exc:
        assert unreadable_data(exc) is None
    try:
        raise RuntimeError("not a read error")
    except RuntimeError as exc:
        assert unreadable_data(exc) is None


@pytest.mark.parametrize("key, value", [("outcome", "5"), ("peak_phase", "[5]")])
def test_a_stored_text_that_is_no_text_is_shown_as_text(
    study_db: Path, tmp_path: Path, key: str, value: str
) -> None:
    # P7-3: an outcome edited to 5 made rich refuse to render the table; P8-1: a peak phase
    # edited to [5] was looked up in a dict (unhashable)
    damaged = tmp_path / "d.db"
    with sqlite3.connect(study_db) as source, sqlite3.connect(damaged) as connection:
        source.backup(connection)
        connection.execute(
            "insert or replace into trial_user_attributes (trial_id, key, value_json) "
            f"select trial_id, '{key}', '{value}' from trials"
        )
    result = CliRunner().invoke(app, ["show", "--storage", str(damaged), "--study", "s"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
