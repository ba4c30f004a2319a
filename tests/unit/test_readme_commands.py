"""CI sees what a newcomer sees: .ci/run runs the README's two commands exactly as written."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _first_command_after(heading: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(heading, 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", section, re.S)
    assert block is not None, heading
    return block.group(1).strip()


def test_ci_runs_the_readme_install_line_and_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install = _first_command_after("## Install and run")
    tests = _first_command_after("## Run the tests")
    assert install in ci and tests in ci
    assert ci.index(install) < ci.index(tests)
    # nothing is started by a bare name that only an activated venv puts on PATH
    assert "activate" not in install and "budgettune search" in install
    assert tests.startswith(".venv/bin/python -m pytest")


PROGRAMS_BY_NAME = {"budgettune", "python", "python3", "pytest", "torchrun", "alembic"}
"""Programs that are on PATH only when the venv is activated (the README never activates it)."""


def _bare_program_calls(path: Path, root: Path = ROOT) -> list[str]:
    """`subprocess.*([...])` calls in a file whose argv starts with a bare program name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in {"run", "Popen", "call", "check_call", "check_output"}:
            continue
        argv = node.args[0] if node.args else None
        if isinstance(argv, ast.List | ast.Tuple) and argv.elts:
            first = argv.elts[0]
            if isinstance(first, ast.Constant) and first.value in PROGRAMS_BY_NAME:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {first.value}")
    return found


def test_no_program_is_started_by_a_bare_name_from_path() -> None:
    files = [p for d in ("src", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    offenders = [hit for f in files for hit in _bare_program_calls(f)]
    assert offenders == [], "start it with sys.executable -m ... instead: " + "; ".join(offenders)


def test_the_scan_sees_a_bare_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('import subprocess\nsubprocess.run(["budgettune", "show"])\n')
    assert _bare_program_calls(sample, tmp_path) == ["sample.py:2: budgettune"]


def _documented_commands() -> list[tuple[str, str]]:
    """Every ``budgettune ...`` line of the README's and the docs' shell blocks (a line that
    ends in a backslash joined to the next; the ``# ...`` comment after it left off), with the
    file it is in."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks, inside, shell = [], False, False
        for text in path.read_text().splitlines():
            if text.startswith("```"):
                inside, shell = not inside, text.strip("`") in ("", "bash", "sh", "console")
                if inside and shell:
                    blocks.append("")
            elif inside and shell:
                blocks[-1] += text + "\n"
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#\s.*$", "", line.strip())
                for cmd in re.findall(r"(?:^|\$\()(?:\.venv/bin/)?(budgettune [^)]*)", line):
                    found.append((path.name, cmd.strip()))
    return found


def test_every_command_the_readme_and_the_docs_show_parses() -> None:
    """Each documented command line is accepted by the CLI as written: its command, every flag
    and argument, every value's type (the CLI's own parser, nothing run; what they do is run
    by the integration tests: test_search_cli's README walk, the CI's first command)."""
    import shlex

    import typer.main

    from budgettune.cli import app

    root: Any = typer.main.get_command(app)
    commands = _documented_commands()
    readme = [cmd for name, cmd in commands if name == "README.md"]
    assert len(readme) >= 10 and len(commands) >= 30
    for name, line in commands:
        args = shlex.split(line)[1:]
        command = root
        while hasattr(command, "commands") and args and args[0] in command.commands:
            command = command.commands[args.pop(0)]
        assert not hasattr(command, "commands"), f"{name}: {line}: no such command"
        try:
            command.make_context(command.name, list(args))
        except Exception as exc:  # click's usage errors: the documented line is wrong
            raise AssertionError(f"{name}: {line}: {exc}") from None
