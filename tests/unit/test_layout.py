"""The layout of issue 8: rooms as subpackages, the old child entry point kept for one release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "budgettune"
MAX_MODULE_LINES = 400


def test_old_child_entry_point_still_runs_the_child() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "budgettune.trial_worker"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "usage: python -m budgettune.trial.child SPEC.json RESULT.json" in done.stderr


def test_python_dash_m_budgettune_is_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "budgettune", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "search" in done.stdout and "worker" in done.stdout


def test_rooms_are_folders() -> None:
    rooms = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert {"trial", "study", "storage", "present", "cli", "workloads"} <= rooms


def test_no_module_is_far_over_400_lines() -> None:
    sizes = {p.relative_to(SRC): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert max(sizes.values()) <= MAX_MODULE_LINES, largest


def test_the_docs_code_layout_names_every_module() -> None:
    layout = (SRC.parents[1] / "docs" / "layout.md").read_text()
    modules = {
        p.stem
        for p in SRC.rglob("*.py")
        if p.stem not in ("__init__", "__main__") and p.parent.name != "__pycache__"
    }
    missing = sorted(m for m in modules if f"`{m}`" not in layout and f"`{m}.py`" not in layout)
    assert not missing, f"docs/layout.md does not name: {missing}"
