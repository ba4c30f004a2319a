"""The wheel's package list (explicit, because of the alembic mapping) covers every package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def test_every_package_under_src_is_listed_and_alembic_is_mapped() -> None:
    setuptools_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(init.parent.relative_to(ROOT / "src").parts)
        for init in (ROOT / "src").rglob("__init__.py")
    }
    listed = set(setuptools_config["packages"])
    assert found | {"budgettune._alembic"} == listed
    assert setuptools_config["package-dir"]["budgettune._alembic"] == "alembic"
    assert not (ROOT / "alembic" / "__init__.py").exists(), "would shadow the alembic library"
