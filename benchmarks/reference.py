"""Reference grid of hand-picked recompute configurations, each measured in a fresh process.

Resumable: every finished configuration is appended to a JSON-lines file, and configurations
already there are skipped, so a grid larger than one 10-minute device command is finished by
running the same command again. Every record carries device, torch version and date.

    python -m benchmarks.reference --set issue2 --out benchmarks/results/llama-h200.jsonl
    python -m benchmarks.reference --set grid --out benchmarks/results/llama-h200.jsonl --gpus 0,1

With ``--gpus 0,1,...`` every GPU measures one configuration at a time (a fresh process that
sees only that GPU), so a grid takes 1/N of the wall time; records are appended as they finish.

The sets (`benchmarks.config_sets`, listed by ``--help``) are on builtin:llama, B=4, T=1024,
bf16, AdamW as usually written unless named ``fused``, where they do not say otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.config_sets import SETS, configs
from budgettune.trial.launcher import launch_trial
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


def done_labels(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["label"] for line in path.read_text().splitlines() if line.strip()}


def measure(config: dict[str, Any], *, device: str, args: argparse.Namespace) -> dict[str, Any]:
    """Measure one configuration in a fresh process on ``device``; the JSON-lines record."""
    spec = TrialSpec(**config["spec"])
    run = TrialRun(
        spec=spec,
        workload=config["workload"],
        workload_options=config["options"],
        device=device,
        cache_root=str(args.runs_dir / "cache") if args.cache else None,
    )
    # a folder per label and device: two workers measuring one label at once (a head to head's
    # rounds, `grid30_final.measure_rounds`) would clear each other's result file (on
    # 2026-11-27 a round's "exited with code 0 without writing a result")
    folder = args.runs_dir / f"{config['label']}-{device.replace(':', '')}"
    result = launch_trial(run, run_dir=folder, timeout_s=args.timeout)
    return {
        **config,
        "spec": spec.to_json_dict(),
        "result": result.to_json_dict(),
        "device": result.device_name,
        "device_index": device,
        "torch_version": result.torch_version,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def summary(record: dict[str, Any]) -> str:
    """One line per measured configuration."""
    result = record["result"]
    m = result.get("measurement")
    figures = (
        f"device {m['peak_device_bytes'] / 1e9:.2f} GB "
        f"alloc {m['peak_allocated_bytes'] / 1e9:.2f} GB "
        f"{m['step_time_ms']:.1f} ms peak in {m['peak_phase']} compile {m['compile_s']:.0f}s"
        if m
        else result.get("error", "")
    )
    return (
        f"{record['label']:<24} {result['outcome']:<8} {figures} "
        f"(wall {result['wall_s']:.0f}s on {record['device_index']})"
    )


def devices_of(args: argparse.Namespace) -> list[str]:
    """``--gpus 0,1`` → ``cuda:0, cuda:1``; else ``--devices`` (comma-separated)."""
    if args.gpus:
        return [f"cuda:{int(g)}" for g in args.gpus.split(",") if g.strip()]
    return [d.strip() for d in args.devices.split(",") if d.strip()]


def _about(name: str) -> str:
    """A set's line in ``--help``."""
    return textwrap.fill(
        SETS[name].about, width=96, initial_indent=f"  {name:<15} ", subsequent_indent=" " * 18
    )


def claim(folder: Path, name: str) -> bool:
    """True for the one process that creates ``folder/name`` first (O_EXCL is atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog="sets:\n" + "\n".join(_about(name) for name in SETS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--set", dest="sets", action="append", required=True, help="set name (repeatable)"
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended)")
    parser.add_argument(
        "--gpus",
        default="",
        help="GPU indices, e.g. 0,1,2,3: one configuration per GPU at a time, all GPUs busy",
    )
    parser.add_argument(
        "--devices", default="cuda", help="devices to spread over when --gpus is not given"
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per configuration")
    parser.add_argument(
        "--stop-after",
        type=float,
        default=480.0,
        help="launch no new configuration after this many seconds (fit one command)",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/budgettune-bench"))
    parser.add_argument("--cache", action="store_true", help="share compile caches per variant")
    parser.add_argument(
        "--claims",
        type=Path,
        default=None,
        help="folder shared by processes on other GPUs: a configuration is measured by the one "
        "that claims it first (a file named for its label)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    done = done_labels(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    wanted = [c for s in args.sets for c in configs(s, warmup=args.warmup, timed=args.timed)]
    pending = list({c["label"]: c for c in wanted if c["label"] not in done}.values())
    devices = devices_of(args)
    print(f"{len(done)} done, {len(pending)} to measure on {', '.join(devices)}", flush=True)
    queue = list(reversed(pending))
    lock = threading.Lock()

    def device_loop(device: str) -> None:
        # One configuration at a time per device (the `search --gpus` rule): each is a fresh
        # process that sees only its GPU; a finished record is appended under the lock.
        while True:
            with lock:
                if not queue:
                    return
                if time.monotonic() - started > args.stop_after:
                    queue.clear()
                    print("stopping: time budget of this command spent; run again to resume")
                    return
                config = queue.pop()
            if args.claims is not None and not claim(args.claims, config["label"]):
                continue
            record = measure(config, device=device, args=args)
            with lock:
                with args.out.open("a") as handle:
                    handle.write(json.dumps(record, sort_keys=True) + "\n")
                print(summary(record), flush=True)

    threads = [threading.Thread(target=device_loop, args=(d,), name=d) for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
