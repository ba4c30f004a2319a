"""benchmarks/report.py renders the committed results; the README table is generated, not typed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(label: str, peak: float | None, ms: float = 10.0) -> dict:
    measurement = None
    if peak is not None:
        measurement = {
            "peak_device_bytes": peak * 1e9 + 1e9,
            "peak_allocated_bytes": peak * 1e9,
            "peak_phase": "optimizer",
            "step_time_ms": ms,
            "step_time_p10_ms": ms - 1,
            "step_time_p90_ms": ms + 1,
            "compile_s": 30.0,
        }
    return {
        "label": label,
        "workload": "builtin:llama",
        "options": {"batch_size": 8} if peak else {},
        "result": {"outcome": "ok" if peak else "oom", "measurement": measurement},
        "device": "NVIDIA H200",
        "torch_version": "2.11.0",
        "date": "2026-11-22T00:00:00+00:00",
    }


def test_table_has_provenance_figures_and_relative_time(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [_record("budget-1.0", 15.0, 10.0), _record("ac", 13.5, 12.5), _record("x", None)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = _report().table(_report().read_records([path]))
    assert "NVIDIA H200, torch 2.11.0, 2026-11-22" in text
    assert (
        "| ac | batch_size=8 | ok | 14.50 | 13.50 | optimizer | 12.5 (11.5-13.5) | +25.0% |"
        in text
    )
    assert "| x | defaults | oom |" in text


def test_readme_section_is_rewritten_between_markers(tmp_path: Path) -> None:
    report = _report()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold\n{report.END}\noutro\n")
    report.rewrite_readme(readme, "NEW TABLE")
    assert readme.read_text() == f"intro\n{report.BEGIN}\nNEW TABLE\n{report.END}\noutro\n"
    (tmp_path / "bare.md").write_text("no markers")
    with pytest.raises(SystemExit):
        report.rewrite_readme(tmp_path / "bare.md", "x")


def test_committed_readme_table_matches_the_results_files() -> None:
    report = _report()
    files = [
        ROOT / "benchmarks" / "results" / "llama-h200.jsonl",
        ROOT / "benchmarks" / "results" / "llama-tied-fp32loss-h200.jsonl",
    ]
    body = report.table(report.read_records(files))
    readme = (ROOT / "README.md").read_text()
    assert f"{report.BEGIN}\n{body}\n{report.END}" in readme
