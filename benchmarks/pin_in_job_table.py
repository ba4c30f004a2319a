"""The README's table of pins applied in fresh training jobs (issue 28), from the reports of
`benchmarks/pin_in_job.py`:

    python -m benchmarks.pin_in_job_table benchmarks/results/h200-pin-in-job-2026-11-26/job-*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(paths: list[Path]) -> list[str]:
    """One markdown row per job report (per rank for a sharded one)."""
    lines = []
    for path in paths:
        report: dict[str, Any] = json.loads(path.read_text())
        pin = Path(report["pin"]).name
        order = report["order"] + (", grad norm" if report.get("grad_norm_first_step") else "")
        pinned_device = report.get("pinned_device_peak_worst_bytes")
        for row in report["ranks"]:
            rank = f" rank {row['rank']}" if report["world_size"] > 1 else ""
            device = f"{row['peak_device_bytes'] / 1e9:.3f}"
            if pinned_device and row["mem_metric"] != "device":
                device += (
                    f" (pin {pinned_device / 1e9:.3f}, "
                    f"{row['peak_device_bytes'] / pinned_device - 1:+.1%})"
                )
            lines.append(
                f"| {pin}{rank} | {order} | {report['device']} | "
                f"{row['pinned_peak_bytes'] / 1e9:.3f} ({row['mem_metric']}) | "
                f"{row['peak_bytes'] / 1e9:.3f} | {row['relative_error']:+.1%} | {device} | "
                f"{row['peak_allocated_bytes'] / 1e9:.3f} | "
                f"{row['step_time_ms']:.1f} / {row['pinned_step_time_ms']:.1f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m benchmarks.pin_in_job_table JOB.json...", file=sys.stderr)
        return 2
    print(
        "| pin | job order | GPU | pin's peak GB | job's peak GB | job vs pin | job device GB | "
        "job allocated GB | step ms (job / pin) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for line in rows(paths):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
