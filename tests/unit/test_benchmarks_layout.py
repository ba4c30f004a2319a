"""benchmarks/: its modules import one another one way only (report and tuner share
benchmarks.common and benchmarks.limits instead of importing each other), and stay short."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _imports(path: Path) -> set[str]:
    """The ``benchmarks`` modules that ``path`` imports, anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    modules = {p.stem for p in BENCHMARKS.glob("*.py")}
    return {n.split(".")[1] for n in found if n.startswith("benchmarks.")} & modules


def test_benchmark_modules_import_each_other_without_a_cycle() -> None:
    graph = {p.stem: _imports(p) - {p.stem} for p in BENCHMARKS.glob("*.py")}
    assert "tuner" not in graph["report"] and "report" not in graph["tuner"]
    assert {"common", "limits"} <= graph["report"] & graph["tuner"]

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    cycles = sorted(name for name in graph if name in reach(name))
    assert cycles == []


def test_no_benchmark_module_is_over_400_lines() -> None:
    long = {
        p.name: n for p in BENCHMARKS.glob("*.py") if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}
