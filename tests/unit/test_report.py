"""benchmarks/report.py renders the committed results; the README table is generated, not typed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _report():
    return importlib.import_module("benchmarks.report")


def _figure():
    return importlib.import_module("benchmarks.figure")


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


def test_committed_results_page_matches_the_results_files() -> None:
    report = _report()
    body = report.results_section(report.read_records([ROOT / f for f in report.README_FILES]))
    readme = (ROOT / "docs" / "results.md").read_text()
    assert f"{report.BEGIN}\n{body}\n{report.END}" in readme


def test_step_times_are_compared_with_the_files_budget_one_row() -> None:
    def row(label: str, ms: float | None) -> dict[str, object]:
        m = None if ms is None else {"step_time_ms": ms}
        return {"label": label, "result": {"measurement": m}}

    baseline_row = _report().baseline_row
    rows = [row("eager", 90.0), row("b8-budget-1.0", None), row("b8-fused-budget-1.0", 80.0)]
    assert baseline_row(rows)["label"] == "b8-fused-budget-1.0"  # the first measured one
    assert baseline_row([row("eager", 90.0), row("ac-every-1", 95.0)])["label"] == "eager"
    assert baseline_row([row("oom", None)]) is None


def test_pareto_front_keeps_only_undominated_points() -> None:
    front = _figure().pareto_front(
        [(17.4, 88.9), (17.4, 82.6), (18.4, 79.2), (18.8, 81.6), (19.9, 77.1), (22.1, 93.1)]
    )
    assert front == [1, 2, 4]


def test_family_of_reads_the_spec() -> None:
    family_of = _figure().family_of
    assert family_of({"compile_mode": "eager", "block_ac_every": 1}) == "eager + block AC"
    assert family_of(
        {"block_ac_every": 1, "block_ac_policy": "op", "optimizer_impl": "fused"}
    ) == ("compile + op-policy AC, fused AdamW")
    assert family_of({"recompute_ops_removed": ["aten.add"]}) == "nosac (0.99, -add)"
    assert family_of({"activation_memory_budget": 0.5}) == "compile, budget"


def test_figure_draws_a_png_and_returns_the_frontier(tmp_path: Path) -> None:
    report = _report()
    rows = [
        _record("budget-1.0", 15.0, 10.0),
        _record("ac", 13.5, 12.5),
        _record("slow", 14.0, 13.0),
    ]
    for row, spec in zip(rows, ({}, {"block_ac_every": 1}, {"activation_memory_budget": 0.5})):
        row["spec"] = spec
    rows.append(_record("oom", None))
    rows[-1]["spec"] = {}
    pin = {"measured": {"peak_device_worst_bytes": 14.6e9, "step_time_ms": 12.0}}
    out = tmp_path / "docs" / "f.png"
    front = report.figure(rows, out, limits={"L1": 15.0}, pins={"tuner": pin})
    assert front == ["ac", "budget-1.0"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_label_offsets_move_crowded_tags_apart() -> None:
    offsets = _figure().label_offsets(
        [19.0, 19.01, 19.02, 19.0, 16.0], [80.0, 80.2, 80.1, 90.0, 80.0], 0.1, 1.0
    )
    # the first of a crowd goes right, the second left, the third right and one step down
    assert offsets[0] == ((5, 3), "left")
    assert offsets[1] == ((-5, 3), "right")
    assert offsets[2] == ((5, -5), "left")
    # far points (another y, another x) keep the default place
    assert offsets[3] == offsets[4] == ((5, 3), "left")
