"""Every command's --help fits 80 columns with every flag name whole (issue 47: rich's tables
cut 14 of search's flag names at 80 columns)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from budgettune.cli import app

COMMAND: Any = typer.main.get_command(app)  # typer's own click (typer._click) in typer 0.29


def _commands() -> list[list[str]]:
    found: list[list[str]] = [[]]
    for name, command in COMMAND.commands.items():
        found.append([name])
        if hasattr(command, "commands"):
            found += [[name, sub] for sub in command.commands]
    return found


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "budgettune")
def test_help_fits_80_columns_and_names_every_flag_whole(path: list[str]) -> None:
    done = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "…" not in done.output
    command = COMMAND
    for name in path:
        command = command.commands[name]
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            for flag in param.opts:
                assert flag in done.output, (flag, path)


CANONICAL = {
    "--storage-url": ("--storage",),
    "--study-name": ("--study",),
    "--trial-timeout-s": ("--timeout",),
    "--collective-timeout-s": ("--collective-timeout",),
    "--reverify-runs": ("--reverify", "--runs"),
}
"""One spelling per concept in every command (issue 47), the old ones still read."""


def test_every_command_spells_storage_study_timeouts_and_reruns_one_way() -> None:
    seen: dict[str, set[str]] = {name: set() for name in CANONICAL}
    for path in _commands():
        command = COMMAND
        for name in path:
            command = command.commands[name]
        for param in command.params:
            if param.param_type_name != "option":
                continue
            for name, old in CANONICAL.items():
                if set(param.opts) & {name, *old}:
                    assert param.opts[0] == name, (path, param.opts)
                    seen[name].add(" ".join(path))
    # each concept is in the commands that take it
    assert {"search", "show", "export", "worker", "dashboard", "db upgrade"} <= seen[
        "--storage-url"
    ]
    assert {"search", "trial", "verify"} <= seen["--trial-timeout-s"]
    assert {"search", "trial"} <= seen["--collective-timeout-s"]
    assert {"search", "verify"} <= seen["--reverify-runs"]
