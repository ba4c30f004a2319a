"""Does one configuration compile to one program? A probe put into trial processes.

The search suite's ``determinism`` step runs one configuration several times, each in compile
caches of its own, with ``PYTHONPATH`` holding a folder whose ``sitecustomize.py`` calls
`install` (``PARTITION_PROBE_OUT`` names where each process writes ``<pid>.json``). Nothing is
imported until torch imports the partitioner or inductor's code cache, so processes that never
compile (the CLI, compile workers) only pay for the finder. Each record holds, per call:

- ``knapsack``: the partitioner's knapsack inputs (sizes and runtime estimates of the
  recomputable nodes, hashed) and what it chose to recompute;
- ``min_cut``: the joint graph's size and the saved values (their names hashed, their count);
- ``code``: each generated module's source, hashed with temporary paths blanked, and its number
  of Triton kernels.

A trial child's record is named by its run folder (``trial-0014.json``), any other process's by
its pid. ``python -m benchmarks.partition_probe summarize DIR`` prints one line a record.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

OUT_ENV = "PARTITION_PROBE_OUT"
_RECORD: dict[str, list[Any]] = {"knapsack": [], "min_cut": [], "code": []}
_PATHS = re.compile(r"/tmp/[^\s'\"]*|/root/[^\s'\"]*")


def _digest(value: Any) -> str:
    return hashlib.md5(json.dumps(value, default=str).encode()).hexdigest()[:10]


def _wrap_partitioners(module: Any) -> None:
    solve, optimize = module.solve_min_cut, module._optimize_runtime_with_given_memory

    def solve_min_cut(joint_graph: Any, *args: Any, **kwargs: Any) -> Any:
        saved, banned = solve(joint_graph, *args, **kwargs)
        _add(
            "min_cut",
            {
                "graph_nodes": len(joint_graph.nodes),
                "saved": len(saved),
                "saved_hash": _digest([n.name for n in saved]),
            },
        )
        return saved, banned

    def knapsack(joint_graph: Any, memory: Any, runtimes: Any, max_memory: Any, *rest: Any) -> Any:
        result = optimize(joint_graph, memory, runtimes, max_memory, *rest)
        _add(
            "knapsack",
            {
                "items": len(memory),
                "memory_hash": _digest([round(m, 9) for m in memory]),
                "runtime_hash": _digest(list(runtimes)),
                "max_memory": max_memory,
                "recompute_hash": _digest(sorted(result[2])),
                "recomputed": len(result[2]),
            },
        )
        return result

    module.solve_min_cut = solve_min_cut
    module._optimize_runtime_with_given_memory = knapsack


def _wrap_codecache(module: Any) -> None:
    cache = module.PyCodeCache
    write = cache.write.__func__

    def write_code(cls: Any, source_code: str, extra: str = "") -> Any:
        if "async_compile" in source_code and "def call(" in source_code:
            _add(
                "code",
                {
                    "chars": len(source_code),
                    "kernels": source_code.count("async_compile.triton("),
                    "hash": _digest(_PATHS.sub("PATH", source_code)),
                },
            )
        return write(cls, source_code, extra)

    cache.write = classmethod(write_code)


_TARGETS = {
    "torch._functorch.partitioners": _wrap_partitioners,
    "torch._inductor.codecache": _wrap_codecache,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps a target module's functions right after it is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                loader, wrap = spec.loader, _TARGETS[name]
                execute = loader.exec_module

                def exec_module(module: Any) -> None:
                    execute(module)
                    wrap(module)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _add(kind: str, entry: dict[str, Any]) -> None:
    """Record one call and rewrite the process's file (a trial child ends in ``os._exit``:
    no exit handler runs)."""
    _RECORD[kind].append(entry)
    folder = Path(os.environ[OUT_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    run = _run_name()
    record = dict(
        _RECORD, pid=os.getpid(), run=run, hash_seed=os.environ.get("PYTHONHASHSEED", "random")
    )
    (folder / f"{run or os.getpid()}.json").write_text(json.dumps(record))


def _run_name() -> str | None:
    """A trial child's run folder name (``trial-0014``, ``reverify-0014-0``): its ``sys.argv``
    is ``[child, SPEC.json, RESULT.json]``, fresh or forked from a trial server."""
    if len(sys.argv) > 1 and sys.argv[1].endswith("SPEC.json"):
        return Path(sys.argv[1]).parent.name
    return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` where ``PARTITION_PROBE_OUT`` is set."""
    if os.environ.get(OUT_ENV):
        sys.meta_path.insert(0, _Finder())


def summarize(folder: Path) -> list[str]:
    """One line a probed process (its run named by the folder above its record)."""
    lines = []
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # a process killed while it wrote, say
            lines.append(f"{path.parent.name}/{path.stem} unreadable: {exc}")
            continue
        if not isinstance(record, dict) or "min_cut" not in record:
            continue
        cuts = " ".join(f"{c['saved']}:{c['saved_hash']}" for c in record["min_cut"])
        knap = " ".join(
            f"{k['recomputed']}/{k['items']}:{k['runtime_hash']}" for k in record["knapsack"]
        )
        code = " ".join(f"{c['kernels']}:{c['hash']}" for c in record["code"])
        lines.append(
            f"{path.parent.name}/{path.stem} seed={record['hash_seed']} cut=[{cuts}] "
            f"knapsack=[{knap}] code=[{code}]"
        )
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "summarize":
        sys.exit("usage: python -m benchmarks.partition_probe summarize DIR")
    if not Path(sys.argv[2]).is_dir():
        sys.exit(f"partition_probe: {sys.argv[2]} is not a folder of probe records")
    print("\n".join(summarize(Path(sys.argv[2]))))
