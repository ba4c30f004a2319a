"""Does another GPU's compile slow this GPU's timed steps, and do CPU shares stop it?

Issue 30's H100 run 3 timed the same GPT-2 medium grid point at 63.6 ms on one host and 76.8 ms
on another, where three Llama-1B searches compiled on the other GPUs
(results/grid30-nvidia-h100-80gb-hbm3/). This measures that suspicion on its own:

    python -m benchmarks.contention --out F.jsonl [--subject gpt2m-full-ac-every-2] \\
        [--gpu 0] [--neighbours 1,2,3] [--repeats 3]

Three phases, each ``--repeats`` fresh-process measurements of the subject (a grid30
configuration, with `grid30_final.FINAL_STEPS`) on ``--gpu``:

- ``alone``: nothing else runs on the host;
- ``busy``: on every neighbour GPU a process compiles Llama-1B grid points one after another
  (inductor's caches off, so it keeps compiling), as the searches and grids of the other GPUs
  do;
- ``shares``: the same neighbours, with the subject and each neighbour on its own share of the
  host's CPUs (`benchmarks.cpu_share`), as the grid suite runs its hand-grid workers
  (`benchmarks/suites/grid-hand.sh`).

Every record carries its phase; the summary gives each phase's median, min and max step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import reference
from benchmarks.cpu_share import share
from benchmarks.grid30_final import FINAL_STEPS
from benchmarks.grid_vs_search import grid_configs

PHASES = ("alone", "busy", "shares")
NEIGHBOUR_SET = "grid30-llama1b"
"""What the neighbours compile: 19 Llama-1B-shape configurations, ~40 s of compile each."""
SETTLE_S = 30.0
"""How long the neighbours run before the subject is timed (their first compile under way)."""


def subject_config(label: str) -> dict[str, Any]:
    """The grid30 configuration ``label`` (``NAME-...``), timed with `FINAL_STEPS`."""
    name = label.split("-", 1)[0]
    config = next((c for c in grid_configs(name) if c["label"] == label), None)
    if config is None:
        raise SystemExit(f"no grid30 configuration {label!r}")
    return {**config, "family": "contention", "spec": {**config["spec"], **FINAL_STEPS}}


def neighbour_command(gpu: int, out: Path, runs_dir: Path) -> list[str]:
    """One neighbour: the Llama-1B grid on ``gpu``, compiling each point (no ``--cache``)."""
    return [
        sys.executable, "-m", "benchmarks.reference", "--set", NEIGHBOUR_SET,
        "--out", str(out), "--gpus", str(gpu), "--runs-dir", str(runs_dir),
        "--stop-after", "100000",
    ]  # fmt: skip


def summary(records: Sequence[dict[str, Any]]) -> str:
    """One line per phase: median, min and max step time of the subject."""
    lines = []
    for phase in PHASES:
        times = sorted(
            r["result"]["measurement"]["step_time_ms"]
            for r in records
            if r["phase"] == phase and r["result"].get("measurement")
        )
        if not times:
            continue
        lines.append(
            f"{phase:<7} n={len(times)} median {statistics.median(times):.1f} ms "
            f"(min {times[0]:.1f}, max {times[-1]:.1f})"
        )
    return "\n".join(lines)


def _start_neighbours(
    gpus: Sequence[int], work: Path, *, cpus: Sequence[int] | None
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    started = []
    for i, gpu in enumerate(gpus):
        part = None if cpus is None else share(cpus, i + 1, len(gpus) + 1)
        out = work / f"neighbour-{gpu}.jsonl"
        out.unlink(missing_ok=True)  # measure every point again: keep compiling
        log = (work / f"neighbour-{gpu}.txt").open("ab")
        started.append(
            subprocess.Popen(
                neighbour_command(gpu, out, work / f"neighbour-{gpu}"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=None
                if part is None
                else lambda part=part: os.sched_setaffinity(0, part),
            )
        )
    return started


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, 15)
    for process in processes:
        process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended)")
    parser.add_argument("--subject", default="gpt2m-full-ac-every-2")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--neighbours", default="1,2,3", help="GPU indices that compile")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bt-contention"))
    args = parser.parse_args(argv)

    config = subject_config(args.subject)
    neighbours = [int(g) for g in args.neighbours.split(",") if g]
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    measuring = argparse.Namespace(runs_dir=args.work / "subject", cache=True, timeout=420.0)
    device = f"cuda:{args.gpu}"
    allowed = sorted(os.sched_getaffinity(0))
    records: list[dict[str, Any]] = []
    reference.measure(config, device=device, args=measuring)  # fills the subject's cache
    for phase in PHASES:
        cpus = allowed if phase == "shares" else None
        running = [] if phase == "alone" else _start_neighbours(neighbours, args.work, cpus=cpus)
        os.sched_setaffinity(0, share(allowed, 0, len(neighbours) + 1) if cpus else allowed)
        try:
            if running:
                time.sleep(SETTLE_S)
            for repeat in range(args.repeats):
                record = reference.measure(config, device=device, args=measuring)
                record.update(phase=phase, repeat=repeat, cpus=len(os.sched_getaffinity(0)))
                records.append(record)
                with args.out.open("a") as out:
                    out.write(json.dumps(record, sort_keys=True) + "\n")
                print(f"{phase}: {reference.summary(record)}", flush=True)
        finally:
            _stop(running)
            os.sched_setaffinity(0, allowed)
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
