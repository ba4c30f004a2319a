"""benchmarks/: its modules import one another one way only (report and tuner share
benchmarks.common and benchmarks.limits instead of importing each other), and stay short."""

from __future__ import annotations

import ast
import os
import re
import shutil
import sqlite3
import subprocess
import tarfile
from pathlib import Path

import pytest

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


# --- the suites behind benchmarks/run.sh (issue 47) ---------------------------------------

ROOT = BENCHMARKS.parent
RUNNER = BENCHMARKS / "run.sh"
SEARCH_DRIVER = BENCHMARKS / "fast_search_gpu.sh"  # the search suite's driver, run as it is
LOCAL_TOOLS_DOC = ROOT / "docs" / "benchmarks.md"  # its "Local tools" run off the device


def _suites() -> list[str]:
    listing = subprocess.run(
        ["bash", str(RUNNER), "--list"], capture_output=True, text=True, check=True
    ).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.rglob("*.sh") if "results" not in p.parts)


def _used_files() -> set[Path]:
    """The scripts and modules a suite reaches: its driver, the scripts it names, the modules
    those run (``benchmarks.X``, ``benchmarks/X.py``), and what those import; plus the local
    tools docs/benchmarks.md lists and their imports."""
    modules = {p.stem: p for p in BENCHMARKS.glob("*.py")}
    scripts = {str(p.relative_to(ROOT)): p for p in _scripts()}
    todo = [RUNNER, SEARCH_DRIVER] + [BENCHMARKS / "suites" / f"{s}.sh" for s in _suites()]
    tools = LOCAL_TOOLS_DOC.read_text().split("## Local tools", 1)[1]
    todo += [modules[m] for m in re.findall(r"benchmarks\.(\w+)", tools)]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        text = path.read_text()
        if path.suffix == ".py":
            todo += [modules[m] for m in _imports(path)]
            continue
        for name, script in scripts.items():
            if name in text or f"suites/{script.name}" in text:
                todo.append(script)
        todo += [modules[m] for m in re.findall(r"benchmarks[./](\w+)", text) if m in modules]
    return seen


def test_run_list_names_each_suite_once_and_each_has_a_driver() -> None:
    suites = _suites()
    assert len(suites) == len(set(suites)) and 5 <= len(suites) <= 8
    assert "search" in suites and SEARCH_DRIVER.exists()
    drivers = {p.stem for p in (BENCHMARKS / "suites").glob("*.sh") if "-" not in p.stem}
    assert drivers == set(suites) - {"search"}


def test_no_orphan_driver_or_module_in_benchmarks() -> None:
    used = _used_files()
    files = [*_scripts(), *(p for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")]
    orphans = sorted(str(p.relative_to(ROOT)) for p in files if p not in used)
    assert orphans == []


def test_every_suite_the_docs_name_exists_and_the_benchmarks_page_names_each() -> None:
    suites = set(_suites())
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs += sorted((BENCHMARKS / "results").glob("**/README.md"))
    named = {
        (str(path.relative_to(ROOT)), suite)
        for path in docs
        for suite in re.findall(r"benchmarks/run\.sh\s+([a-z][\w-]*)", path.read_text())
    }
    assert {pair for pair in named if pair[1] not in suites} == set()
    page = LOCAL_TOOLS_DOC.read_text()
    assert all(f"bash benchmarks/run.sh {suite} " in page for suite in suites)
    assert "benchmarks.md" in (ROOT / "mkdocs.yml").read_text()


def test_every_benchmark_script_parses_and_says_its_usage() -> None:
    for script in _scripts():
        subprocess.run(["bash", "-n", str(script)], check=True)
        head = script.read_text().splitlines()[:12]
        usage = ("bash benchmarks/", "Sourced by")  # device_env.sh is sourced, not run
        assert any(u in line for line in head for u in usage), script


def test_the_runner_refuses_an_unknown_suite_with_one_line() -> None:
    done = subprocess.run(
        ["bash", str(RUNNER), "nosuch", "10"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert "nosuch" in done.stderr and "--list" in done.stderr


@pytest.mark.parametrize(("suite", "step"), [("grid", "L9x"), ("job", "pin"), ("families", "x")])
def test_a_suite_refuses_an_unknown_step_before_it_runs(
    suite: str, step: str, tmp_path: Path
) -> None:
    env = {**os.environ, "BT_STATE": str(tmp_path), "BT_OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "suites" / f"{suite}.sh"), step],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 2 and step in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_runner_starts_a_driver_waits_and_brings_back_its_folder(tmp_path: Path) -> None:
    """run.sh end to end with a stand-in suite: its driver detached in the state folder, its
    out/ (a SQLite study copied through the backup API) and the workers' logs in SUITE.tar; a
    second call with the same arguments only brings them back."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "suites").mkdir(parents=True)
    shutil.copy(RUNNER, repo / "benchmarks" / "run.sh")
    env_sh = (BENCHMARKS / "device_env.sh").read_text()
    install = re.search(r"^if \[ ! -f /tmp/site.*?^fi\n", env_sh, re.S | re.M)
    assert install is not None  # the wheels' install: not on this machine
    (repo / "benchmarks" / "device_env.sh").write_text(env_sh.replace(install.group(0), ""))
    fake_suite = """echo "args $*"
echo made > "$BT_OUT/made.txt"
python3 - "$BT_OUT/s.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("pragma journal_mode=wal")
c.execute("create table t (x)")
c.execute("insert into t values (1)")
c.commit()
PY
mkdir -p "$BT_STATE/runs/s/workers" && echo trial 0 > "$BT_STATE/runs/s/workers/cuda0.log"
"""
    (repo / "benchmarks" / "suites" / "workers.sh").write_text(fake_suite)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "BT_STATE_ROOT": str(tmp_path / "state")}
    call = ["bash", "benchmarks/run.sh", "workers", "30", "a b"]
    first = subprocess.run(call, capture_output=True, text=True, cwd=repo, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "run.sh: workers driver done"
    with tarfile.open(out / "workers" / "workers.tar") as tar:
        names = {n.lstrip("./") for n in tar.getnames()}
        assert {"made.txt", "s.db", "driver.log", "workers.log"} <= names
        tar.extract("./s.db", tmp_path / "x")
        assert "args a b" in tar.extractfile("./driver.log").read().decode()  # type: ignore[union-attr]
    assert sqlite3.connect(tmp_path / "x" / "s.db").execute("select x from t").fetchall() == [(1,)]
    second = subprocess.run(call, capture_output=True, text=True, cwd=repo, env=env)
    assert "done before with these arguments" in second.stdout
    assert second.stdout.splitlines()[-1] == "run.sh: workers driver done"
