"""Issue 47: one spelling per concept across the commands. Every command that opens the store
takes ``--storage-url`` (``--storage`` still read) and reads ``BUDGETTUNE_STORAGE`` when it is
not given; every command that reads one study takes ``--study-name`` (``--study`` still read);
``budgettune --version`` prints the version."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app

runner = CliRunner()
STORE = [["search"], ["show"], ["export"], ["worker"], ["dashboard"], ["db", "upgrade"]]
STUDY = [["search"], ["show"], ["export"], ["worker"]]


def _help(command: list[str]) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("command", STORE, ids=" ".join)
def test_every_command_that_opens_the_store_spells_it_alike(command: list[str]) -> None:
    text = _help(command)
    assert "--storage-url" in text and "--storage " in text.replace(",", " ")
    if command in STUDY:
        assert "--study-name" in text


def test_every_command_reads_the_storage_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'team.db'}"
    done = runner.invoke(app, ["db", "upgrade"], env={"BUDGETTUNE_STORAGE": url})
    assert done.exit_code == 0, done.output
    assert (tmp_path / "team.db").exists() and not (tmp_path / "budgettune.db").exists()
    shown = runner.invoke(app, ["show"], env={"BUDGETTUNE_STORAGE": url})
    assert shown.exit_code == 2 and "no studies in sqlite:" in shown.stderr
    assert "team.db" in shown.stderr
    old = runner.invoke(app, ["show", "--storage", url, "--study", "nope"])
    assert old.exit_code == 2 and "no study 'nope'" in old.stderr  # the old spellings read


def test_version() -> None:
    done = runner.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.stdout == f"budgettune {version('budgettune')}\n"


def test_verify_from_another_folder_says_where_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: a pin names its builder file as the search was given it (relative to the
    folder the search ran in); verify elsewhere says so in one line."""
    import json

    from budgettune.trial.spec import TrialSpec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pin.json").write_text(json.dumps({
        "schema_version": 1, "spec": TrialSpec(compile_mode="eager").to_json_dict(),
        "workload": "mymodel.py:build", "limit_bytes": 10**9, "mem_metric": "device",
    }))  # fmt: skip
    done = runner.invoke(app, ["verify", "pin.json", "--device", "cpu"])
    lines = done.stderr.strip().splitlines()
    assert done.exit_code != 0 and len(lines) == 1
    assert "relative to the folder the search ran in" in lines[0] and str(tmp_path) in lines[0]


def test_applying_a_pin_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: applying a pin was silent unless the job configured logging."""
    import logging

    from torch import nn

    from budgettune.pinning import parse_pin
    from budgettune.trial.spec import TrialSpec

    pinned = parse_pin({
        "schema_version": 1, "spec": TrialSpec(compile_mode="eager").to_json_dict(),
        "workload": "builtin:tiny-gpt", "limit_bytes": 10**9, "mem_metric": "device",
    }, source="best.json")  # fmt: skip
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a job with no logging set up
    pinned.compile(nn.Linear(2, 2))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"budgettune: applying pin best.json to Linear: {pinned.spec.describe()}"]


def test_verify_takes_the_pin_as_export_spells_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export --pin PIN`` and ``verify --pin PIN``: the pin one way in both (the positional
    still read); neither or both is one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    for args in (["verify", "--pin", "nope.json"], ["verify", "nope.json"]):
        done = runner.invoke(app, [*args, "--device", "cpu"])
        assert done.exit_code == 2 and "nope.json" in done.stderr, done.output
    for args in (["verify"], ["verify", "a.json", "--pin", "b.json"]):
        done = runner.invoke(app, args)
        assert done.exit_code == 2
        assert "verify takes one pinned config" in done.stderr, done.output
    assert "--pin" in _help(["verify"]) and "--pin" in _help(["export"])
