"""Issue 47: one spelling per concept across the commands. Every command that opens the store
takes ``--storage-url`` (``--storage`` still read) and reads ``BUDGETTUNE_STORAGE`` when it is
not given; every command that reads one study takes ``--study-name`` (``--study`` still read);
``budgettune --version`` prints the version."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from storage_samples import pin_document
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

    pinned = parse_pin(pin_document(TrialSpec(compile_mode="eager")), source="best.json")
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


#: The concepts every command spells alike (issue 47): the first name is the spelling, the
#: others the older ones still read; each command that takes the concept takes exactly these.
CONCEPTS = {
    "storage": (
        ("--storage-url", "--storage"),
        ["search", "show", "export", "worker", "dashboard", "db upgrade"],
    ),
    "study": (("--study-name", "--study"), ["search", "show", "export", "worker"]),
    "output": (("--output", "-o"), ["search", "export"]),  # export's -o: its old spelling
    "pin": (("--pin",), ["export", "verify"]),
    "trial timeout": (("--trial-timeout-s", "--timeout"), ["search", "trial", "verify"]),
    "collective timeout": (
        ("--collective-timeout-s", "--collective-timeout"),
        ["search", "trial"],
    ),
    "re-runs": (("--reverify-runs", "--reverify", "--runs"), ["search", "verify"]),
}
#: Older spellings that mean one thing in one command and another elsewhere, read still.
OLD_CLASHES = {
    "-o": {"--option", "--output"},
    "--seed": {"--sampler-seed", "--seed"},
    "--trials": {"--num-trials", "--max-trials"},
}


def _commands() -> dict[str, object]:
    import typer.main

    root: Any = typer.main.get_command(app)
    found: dict[str, object] = {}
    for name, command in root.commands.items():
        if hasattr(command, "commands"):  # a group (typer carries its own click)
            for sub, inner in command.commands.items():
                found[f"{name} {sub}"] = inner
        else:
            found[name] = command
    return found


def _options(command: Any) -> list[tuple[str, ...]]:
    return [tuple(p.opts) for p in command.params if p.param_type_name == "option"]


@pytest.mark.parametrize("concept", sorted(CONCEPTS))
def test_every_command_spells_a_concept_alike(concept: str) -> None:
    names, takers = CONCEPTS[concept]
    commands = _commands()
    for name, command in commands.items():
        longs = {n for n in names if n.startswith("--")}  # -o is also search's --option
        spelled = [opts for opts in _options(command) if set(opts) & longs]
        if name in takers:
            assert spelled and set(spelled[0]) >= set(names[:1]), (name, spelled)
            assert set(spelled[0]) <= set(names), (name, spelled)
        else:
            assert not spelled, f"{name} takes {spelled} but is not listed for {concept}"


def test_no_flag_means_two_things_but_the_old_spellings_listed() -> None:
    meanings: dict[str, set[str]] = {}
    for command in _commands().values():
        for opts in _options(command):
            primary = next((o for o in opts if o.startswith("--")), opts[0])
            for flag in opts:
                meanings.setdefault(flag, set()).add(primary)
    clashes = {flag: seen for flag, seen in meanings.items() if len(seen) > 1}
    assert {flag: seen for flag, seen in clashes.items() if flag not in OLD_CLASHES} == {}
    for flag, seen in clashes.items():
        assert seen <= OLD_CLASHES[flag] | {flag}, (flag, seen)
