"""Render the benchmark JSON-lines results as a markdown table and a figure (never by hand).

python -m benchmarks.report benchmarks/results/llama-h200.jsonl ...      # print the table
python -m benchmarks.report --readme docs/results.md benchmarks/results/*.jsonl  # rewrite
    the results page's section between the "results:begin" and "results:end" markers
python -m benchmarks.report --figure docs/frontier-llama-tied-fp32loss.png --limit limit=18 \
    --pin "search, 6 trials=benchmarks/results/h200-2026-11-22/llama-pin.json" \
    --title "builtin:llama as first defined (tied head, fp32 loss), B=4, AdamW as written; \
NVIDIA H200, torch 2.11.0+cu130, 2026-11-22" benchmarks/results/llama-tied-fp32loss-h200.jsonl
    # memory x time: grid points by family, their frontier, the limits (--limit NAME=GB),
    # the pinned points (--pin LABEL=PIN.json); the committed docs/ figure was made so
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import judged, options_cell, pct, read_records, script_main, target_cell
from benchmarks.figure import figure
from benchmarks.limits import limits_table

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README_FILES = tuple(
    Path("benchmarks/results") / name
    for name in (
        "tuner-h200.jsonl",
        "wall-h200.jsonl",
        "wall-h100.jsonl",
        "llama-grid-h200.jsonl",
        "llama-b8-h200.jsonl",
        "vit-grid-h200.jsonl",
        "llama-b64-h200.jsonl",
    )
)
"""What the README's results section is rendered from (``--readme`` with no files)."""
COLUMNS = (
    "config",
    "workload options",
    "outcome",
    "peak device GB",
    "peak allocated GB",
    "peak in",
    "step ms (p10-p90)",
    "vs baseline",
    "compile s",
)


def baseline_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a file's step times are compared with: its first measured compile at budget 1.0
    (a label ending in ``budget-1.0``: the user's unconstrained baseline), else its first
    measured row."""
    measured = [r for r in rows if r["result"].get("measurement")]
    return next((r for r in measured if r["label"].endswith("budget-1.0")), None) or next(
        iter(measured), None
    )


def table(records: list[dict[str, Any]]) -> str:
    """One markdown table per results file, each with its device, torch version and dates."""
    out: list[str] = []
    by_file: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_file.setdefault(record["_file"], []).append(record)
    for name, rows in by_file.items():
        dates = sorted(r["date"][:10] for r in rows)
        devices = sorted({r["device"] for r in rows})
        torches = sorted({r["torch_version"] for r in rows})
        base = baseline_row(rows)
        base_ms = base["result"]["measurement"]["step_time_ms"] if base else None
        out.append(
            f"**{name}** — {', '.join(devices)}, torch {', '.join(torches)}, "
            f"{dates[0]}{'' if dates[0] == dates[-1] else ' to ' + dates[-1]}, "
            f"workload {rows[0]['workload']}; baseline {base['label'] if base else '-'}\n"
        )
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        for r in rows:
            result = r["result"]
            m = result.get("measurement")
            if m is None or base_ms is None:
                cells = [r["label"], options_cell(r["options"]), result["outcome"]] + ["-"] * 6
            else:
                cells = [
                    r["label"],
                    options_cell(r["options"]),
                    result["outcome"],
                    f"{m['peak_device_bytes'] / 1e9:.2f}",
                    f"{m['peak_allocated_bytes'] / 1e9:.2f}",
                    m["peak_phase"],
                    f"{m['step_time_ms']:.1f} ({m['step_time_p10_ms']:.1f}-"
                    f"{m['step_time_p90_ms']:.1f})",
                    f"{(m['step_time_ms'] / base_ms - 1) * 100:+.1f}%",
                    f"{m['compile_s']:.0f}",
                ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


TUNER_COLUMNS = (
    "limit",
    "GB",
    "pinned config",
    "worst peak GB (runs)",
    "step ms",
    "vs baseline",
    "target",
    "best grid config under the limit",
    "pin vs grid best",
    "to within 2% of grid best",
    "total wall",
    "GPUs",
    "trials",
)


def versus(r: dict[str, Any]) -> str:
    """The tuner row's "vs baseline" cell: against the search's own re-measured baseline (when
    the pin has it) and against the grid's."""
    base = r["baseline"]
    grid = pct(r["vs_baseline"]) + ("" if base is None else f" vs {base['label']}")
    if r.get("vs_study_baseline") is None:
        return grid
    runs = r.get("study_baseline_runs")
    return f"{pct(r['vs_study_baseline'])} ({runs} runs in the study); grid: {grid}"


def tuner_table(records: list[dict[str, Any]]) -> str:
    """The tuner's per-limit records (``benchmarks/tuner.py``) as one markdown table."""
    if not records:
        return ""
    devices = sorted({r["device"] for r in records})
    torches = sorted({r["torch_version"] for r in records})
    dates = sorted(r["date"][:10] for r in records)
    out = [
        f"**Tuner** — {', '.join(devices)}, torch {', '.join(torches)}, {dates[0]}"
        f"{'' if dates[0] == dates[-1] else ' to ' + dates[-1]}\n",
        "| " + " | ".join(TUNER_COLUMNS) + " |",
        "|" + "---|" * len(TUNER_COLUMNS),
    ]

    for r in records:
        pin, best, within = r["pin"], r["grid_best"], r["within_2pct"]
        grid_cell = (
            "none fits"
            if best is None
            else f"{best['label']} ({best['peak_device_bytes'] / 1e9:.2f} GB, "
            f"{best['step_time_ms']:.1f} ms)"
        )
        reached = (
            "not reached"
            if within is None
            else f"{within['trials']} trials, {within['wall_s']:.0f} s"
        )
        wall = "-" if r["total_wall_s"] is None else f"{r['total_wall_s']:.0f} s"
        if r.get("active_wall_s") is not None:
            wall += f" ({r['active_wall_s']:.0f} s running)"
        target = target_cell(r.get("max_slowdown"), bool(r["target_met"]))
        cells = [
            r["name"],
            f"{r['limit_bytes'] / 1e9:.2f}",
            pin["config"],
            f"{pin['peak_worst_bytes'] / 1e9:.2f} ({pin['runs']})",
            f"{pin['step_time_ms']:.1f}",
            versus(r),
            target,
            grid_cell,
            pct(r["vs_grid_best"]),
            reached,
            wall,
            "-" if r.get("gpus") is None else str(r["gpus"]),
            str(r["trials"]),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def wall_table(records: list[dict[str, Any]]) -> str:
    """The search wall-time records (``benchmarks/tuner.py wall``) as one markdown table."""
    if not records:
        return ""
    out = [
        "**Search wall time** (issue 10: 20 trials and re-verification of "
        "`studies/llama-1b.toml`; targets <= 20 min on 1 GPU, <= 6 min on 4)\n",
        "| search | device | GPUs | trials | trials' wall | fresh runs | re-verification wall "
        "| total | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        target = (
            "-"
            if r["target_s"] is None
            else judged(f"<= {r['target_s'] / 60:.0f} min", bool(r["target_met"]))
        )
        cells = [
            f"{r['name']} ({r['date'][:10]})",
            f"{r['device']}, torch {r['torch_version']}",
            str(r["gpus"]),
            str(r["trials"]),
            f"{r['trials_wall_s']:.0f} s",
            str(r["fresh_runs"]),
            f"{r['reverify_wall_s']:.0f} s",
            f"{r['total_wall_s']:.0f} s ({r['total_wall_s'] / 60:.1f} min)"
            + (
                ""
                if r.get("command_wall_s") is None
                else f"; the command {r['command_wall_s']:.0f} s "
                f"({r['command_wall_s'] / 60:.1f} min"
                + (f", {r['command_wall_note']}" if r.get("command_wall_note") else "")
                + ")"
            ),
            target,
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def _named(values: list[str], what: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{what} takes NAME=VALUE, got {value!r}")
        pairs.append((name, rest))
    return pairs


def _gb(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"--limit takes NAME=GB (a number), got GB {text!r}") from None


def rewrite_readme(readme: Path, body: str) -> None:
    """Replace the text between the markers (they must exist)."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}")


def grid_records(everything: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured configurations among the records read (not the tuner or wall records)."""
    return [r for r in everything if r.get("kind") not in ("tuner", "wall")]


def results_section(everything: Sequence[dict[str, Any]]) -> str:
    """The README's results section from every record read: the limits, the tuner searches,
    the search wall times, then each results file's grid table."""
    records = grid_records(everything)
    tuned = [r for r in everything if r.get("kind") == "tuner"]
    walls = [r for r in everything if r.get("kind") == "wall"]
    parts = (limits_table(records), tuner_table(tuned), wall_table(walls), table(records))
    return "\n".join(part for part in parts if part)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "files", nargs="*", type=Path, help="results files (with --readme: default README_FILES)"
    )
    parser.add_argument("--readme", type=Path, help="rewrite this README's results section")
    parser.add_argument("--figure", type=Path, help="draw the memory x time figure to this PNG")
    parser.add_argument("--limit", action="append", default=[], help="NAME=GB (repeatable)")
    parser.add_argument("--pin", action="append", default=[], help="LABEL=PIN.json (repeatable)")
    parser.add_argument("--title", help="figure title (default from the records)")
    args = parser.parse_args(argv)
    if not args.files:
        if not args.readme:
            parser.error("give the results files (only --readme has a default)")
        args.files = list(README_FILES)
    everything = read_records(args.files)
    if args.figure:
        limits = {name: _gb(gb) for name, gb in _named(args.limit, "--limit")}
        pins = {label: json.loads(Path(p).read_text()) for label, p in _named(args.pin, "--pin")}
        front = figure(
            grid_records(everything), args.figure, limits=limits, pins=pins, title=args.title
        )
        sys.stdout.write(f"{args.figure}: frontier {', '.join(front)}\n")
        return 0
    body = results_section(everything)
    if args.readme:
        rewrite_readme(args.readme, body)
    else:
        sys.stdout.write(body + "\n")
    return 0


if __name__ == "__main__":
    script_main(main)
