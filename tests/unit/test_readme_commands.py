"""CI sees what a newcomer sees: .ci/run runs the README's two commands exactly as written."""

from __future__ import annotations

import re
from pathlib import Path

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
