"""Render the benchmark JSON-lines results as a markdown table (never typed by hand).

python benchmarks/report.py benchmarks/results/llama-h200.jsonl ...      # print the table
python benchmarks/report.py --readme README.md benchmarks/results/*.jsonl  # rewrite the
    README section between the "results:begin" and "results:end" markers
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COLUMNS = (
    "config",
    "workload options",
    "outcome",
    "peak device GB",
    "peak allocated GB",
    "peak in",
    "step ms (p10-p90)",
    "vs first row",
    "compile s",
)


def read_records(paths: list[Path]) -> list[dict[str, Any]]:
    """All records of the files, in file then line order."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                record["_file"] = path.name
                records.append(record)
    return records


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items())) or "defaults"


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
        out.append(
            f"**{name}** — {', '.join(devices)}, torch {', '.join(torches)}, "
            f"{dates[0]}{'' if dates[0] == dates[-1] else ' to ' + dates[-1]}, "
            f"workload {rows[0]['workload']}\n"
        )
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        first_ms = None
        for r in rows:
            result = r["result"]
            m = result.get("measurement")
            if m is None:
                cells = [r["label"], _options(r["options"]), result["outcome"]] + ["-"] * 6
            else:
                first_ms = first_ms or m["step_time_ms"]
                cells = [
                    r["label"],
                    _options(r["options"]),
                    result["outcome"],
                    f"{m['peak_device_bytes'] / 1e9:.2f}",
                    f"{m['peak_allocated_bytes'] / 1e9:.2f}",
                    m["peak_phase"],
                    f"{m['step_time_ms']:.1f} ({m['step_time_p10_ms']:.1f}-"
                    f"{m['step_time_p90_ms']:.1f})",
                    f"{(m['step_time_ms'] / first_ms - 1) * 100:+.1f}%",
                    f"{m['compile_s']:.0f}",
                ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def rewrite_readme(readme: Path, body: str) -> None:
    """Replace the text between the markers (they must exist)."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--readme", type=Path, help="rewrite this README's results section")
    args = parser.parse_args(argv)
    body = table(read_records(args.files))
    if args.readme:
        rewrite_readme(args.readme, body)
    else:
        sys.stdout.write(body + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
