"""Issue 44 on the GPU: what the device must show before a timed search, pins head to head,
and the phase table of a kept study (before and after).

    python -m benchmarks.fast_search check --out check.json
    python -m benchmarks.fast_search versus --pins a.json b.json --rounds 3 --out h2h.jsonl
    python -m benchmarks.fast_search phases --storage sqlite:///x.db [--study NAME]

``check``: a trial server starts on the GPU host without touching CUDA and forks a CUDA trial
(its log says so, its imports take no time), NVML gives this process's own device memory (what
a trial on a shared GPU needs), and torch's compile callbacks name their triggers.
``versus``: each pin's configuration measured in fresh processes, the pins in turn, round after
round on one GPU (compile caches warm after the first round, as a search's re-measurements
are); the median of each.
``phases``: `budgettune show --phases` for a kept database (an older revision is read through
an upgraded copy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import kept_storage, script_main

_NVML_CHECK = """
import torch
torch.zeros(1, device="cuda")
from budgettune.trial.devices import process_used_bytes
print(process_used_bytes(0))
"""


def check(out: Path, runs_dir: Path) -> int:
    """The facts issue 44's code rests on, on this host (see the module's docstring)."""
    from budgettune.trial.launcher import launch_trial
    from budgettune.trial.servers import TrialServers
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun

    facts: dict[str, Any] = {}
    nvml = subprocess.run([sys.executable, "-c", _NVML_CHECK], capture_output=True, text=True)
    facts["process_used_bytes"] = nvml.stdout.strip() or nvml.stderr.strip()[-300:]
    triggers = subprocess.run(
        [sys.executable, "-c", "from torch._dynamo.callback import CallbackTrigger as T; "
         "print([t.name for t in T])"],
        capture_output=True, text=True,
    )  # fmt: skip
    facts["callback_triggers"] = triggers.stdout.strip() or triggers.stderr.strip()[-300:]
    run = TrialRun(
        spec=TrialSpec(warmup_steps=1, timed_steps=3),
        workload="builtin:tiny-gpt",
        device="cuda",
        cache_root=str(runs_dir / "cache"),
    )
    with TrialServers(log_dir=runs_dir / "servers", ready_wait_s=600) as servers:
        served = [
            launch_trial(run, run_dir=runs_dir / f"served-{i}", servers=servers) for i in (0, 1)
        ]
        facts["servers_disabled"] = servers.disabled
    fresh = launch_trial(run, run_dir=runs_dir / "fresh")
    for name, result in (("served", served[-1]), ("fresh", fresh)):
        m = result.measurement
        facts[name] = {
            "outcome": result.outcome.value,
            "error": result.error,
            "forked": "forked by trial server" in Path(result.log_path).read_text(),
            "phases_s": dict(result.phases_s),
            "peak_device_bytes": None if m is None else m.peak_device_bytes,
            "step_time_ms": None if m is None else m.step_time_ms,
        }
    out.write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))
    ok = facts["served"]["forked"] and facts["served"]["outcome"] == "ok"
    return 0 if ok else 1


def versus(pins: Sequence[Path], *, rounds: int, out: Path, runs_dir: Path) -> int:
    """The pins head to head (see the module's docstring); one JSON line per measurement."""
    from budgettune.pinning import load_pinned
    from budgettune.trial.launcher import launch_trial
    from budgettune.trial.servers import TrialServers
    from budgettune.trial.trial_run import TrialRun

    runs = []
    for path in pins:
        pin = load_pinned(path, warn=False, apply_allocator=False).pin
        runs.append(
            TrialRun(
                spec=pin.spec,
                workload=pin.workload,
                workload_options=pin.workload_options,
                device="cuda",
                cache_root=str(runs_dir / "cache"),
            )
        )
    times: dict[str, list[float]] = {str(p): [] for p in pins}
    with TrialServers(log_dir=runs_dir / "servers", ready_wait_s=600) as servers, out.open(
        "a"
    ) as lines:
        for round_ in range(rounds):
            for index, (path, run) in enumerate(zip(pins, runs, strict=True)):
                folder = runs_dir / f"round-{round_}-pin-{index}"
                result = launch_trial(run, run_dir=folder, timeout_s=900, servers=servers)
                m = result.measurement
                row = {
                    "pin": str(path),
                    "round": round_,
                    "outcome": result.outcome.value,
                    "step_time_ms": None if m is None else m.step_time_ms,
                    "peak_device_bytes": None if m is None else m.peak_device_bytes,
                    "device": result.device_name,
                    "torch_version": result.torch_version,
                }
                lines.write(json.dumps(row) + "\n")
                lines.flush()
                if m is not None:
                    times[str(path)].append(m.step_time_ms)
                print(json.dumps(row), flush=True)
    first = statistics.median(times[str(pins[0])]) if times[str(pins[0])] else None
    for path, measured in times.items():
        if not measured:
            print(f"{path}: nothing measured")
            continue
        median = statistics.median(measured)
        vs = "" if first is None else f" ({(median / first - 1) * 100:+.1f} % vs the first)"
        print(f"{path}: median {median:.2f} ms of {len(measured)}{vs}")
    return 0


def phases(storage: str, study: str | None) -> int:
    """The phase table of a kept study database (`budgettune show --phases`)."""
    from rich.console import Console

    from budgettune.present.phases import phase_of, phase_summary, phase_table
    from budgettune.present.report import resolve_study_name

    with kept_storage(storage) as store:
        name = resolve_study_name(store, study)
        rows = [phase_of(run) for run in store.measurements(name)]
    console = Console(width=140)
    console.print(phase_table(rows, title=f"where study {name}'s time went, process by process"))
    console.print(phase_summary(rows, title=f"where study {name}'s time went"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check")
    p_check.add_argument("--out", type=Path, required=True)
    p_check.add_argument("--runs-dir", type=Path, default=Path("/tmp/bt-check"))
    p_versus = sub.add_parser("versus")
    p_versus.add_argument("--pins", nargs="+", type=Path, required=True)
    p_versus.add_argument("--rounds", type=int, default=3)
    p_versus.add_argument("--out", type=Path, required=True)
    p_versus.add_argument("--runs-dir", type=Path, default=Path("/tmp/bt-versus"))
    p_phases = sub.add_parser("phases")
    p_phases.add_argument("--storage", required=True)
    p_phases.add_argument("--study", default=None)
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.out, args.runs_dir)
    if args.command == "versus":
        return versus(args.pins, rounds=args.rounds, out=args.out, runs_dir=args.runs_dir)
    return phases(args.storage, args.study)


if __name__ == "__main__":
    script_main(main)
