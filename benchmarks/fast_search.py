"""Issue 44 on the GPU: what the device must show before a timed search, pins head to head,
and the phase table of a kept study (before and after).

    python -m benchmarks.fast_search check --out check.json
    python -m benchmarks.fast_search versus --pins a.json b.json --rounds 3 --out h2h.jsonl \
        [--finder sqlite:///batch.db STUDY]
    python -m benchmarks.fast_search phases --storage sqlite:///x.db [--study NAME]

``check``: a trial server starts on the GPU host without touching CUDA and forks a CUDA trial
(its log says so, its imports take no time), NVML gives this process's own device memory (what
a trial on a shared GPU needs), and torch's compile callbacks name their triggers.
``versus``: each pin's configuration measured in fresh processes, the pins in turn, round after
round on one GPU (compile caches warm after the first round, as a search's re-measurements
are); the median of each. ``--finder STORAGE STUDY`` adds a batch search's batch finder point
(the largest micro-batch that fit at budget 1.0, as given; issue 46) in the first pin's
workload; each row has the samples per second beside the step time.
``phases``: `budgettune show --phases` for a kept database (an older revision is read through
an upgraded copy).
"""

from __future__ import annotations

import argparse
import dataclasses
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


def finder_point(url: str, study: str) -> tuple[Any, Any]:
    """What a batch finder returns, read from a batch search's study (issue 46): of its trials at
    budget 1.0 as given (``batch-none-M``, and the unconstrained baseline at the given
    micro-batch), the one of the largest micro-batch that fit. Returns ``(spec, TrialRecord)``.

    Raises:
        StorageError: no such storage or study; ValueError: no batch-none point fit there.
    """
    from benchmarks.common import study_trials
    from budgettune.storage.trials import UNCONSTRAINED
    from budgettune.storage.user_attrs import TrialRecord
    from budgettune.study.structured import BATCH_PREFIX

    records = [TrialRecord.from_attrs(t.user_attrs) for t in study_trials(url, [study])[study]]
    fitting = [
        r
        for r in records
        if r.baseline is not None
        and (r.baseline == UNCONSTRAINED or r.baseline.startswith(f"{BATCH_PREFIX}none-"))
        and r.fits()
        and r.spec
    ]
    if not fitting:
        raise ValueError(f"study {study}: no batch-none point fits")
    best = max(fitting, key=lambda r: r.spec.micro_batch or 0)
    return best.spec, best


def versus(
    pins: Sequence[Path],
    *,
    rounds: int,
    out: Path,
    runs_dir: Path,
    finder: tuple[str, str] | None = None,
) -> int:
    """The pins head to head (see the module's docstring); one JSON line per measurement.
    ``finder``: ``(storage, study)`` of a batch search, whose batch finder point
    (`finder_point`) is measured with them, in the first pin's workload."""
    from budgettune.pinning import load_pinned
    from budgettune.trial.launcher import launch_trial
    from budgettune.trial.servers import TrialServers
    from budgettune.trial.trial_run import TrialRun

    entries: list[tuple[str, TrialRun]] = []
    for path in pins:
        pin = load_pinned(path, warn=False, apply_allocator=False).pin
        entries.append(
            (
                str(path),
                TrialRun(
                    spec=pin.spec,
                    workload=pin.workload,
                    workload_options=pin.workload_options,
                    device="cuda",
                    cache_root=str(runs_dir / "cache"),
                ),
            )
        )
    if finder is not None:
        spec, _ = finder_point(*finder)
        entries.append((f"finder:{finder[1]}", dataclasses.replace(entries[0][1], spec=spec)))
    times: dict[str, list[float]] = {name: [] for name, _ in entries}
    rates: dict[str, list[float]] = {name: [] for name, _ in entries}
    with (
        TrialServers(log_dir=runs_dir / "servers", ready_wait_s=600) as servers,
        out.open("a") as lines,
    ):
        for round_ in range(rounds):
            for index, (name, run) in enumerate(entries):
                folder = runs_dir / f"round-{round_}-pin-{index}"
                result = launch_trial(run, run_dir=folder, timeout_s=900, servers=servers)
                m = result.measurement
                row = {
                    "pin": name,
                    "round": round_,
                    "outcome": result.outcome.value,
                    "micro_batch": run.spec.micro_batch,
                    "accum_steps": run.spec.accum_steps,
                    "step_time_ms": None if m is None else m.step_time_ms,
                    "forward_backward_ms": None if m is None else m.forward_backward_ms,
                    "optimizer_ms": None if m is None else m.optimizer_ms,
                    "samples_per_step": None if m is None else m.samples_per_step,
                    "samples_per_s": None if m is None else m.samples_per_s,
                    "tokens_per_s": None if m is None else m.tokens_per_s,
                    "peak_device_bytes": None if m is None else m.peak_device_bytes,
                    "device": result.device_name,
                    "torch_version": result.torch_version,
                }
                lines.write(json.dumps(row) + "\n")
                lines.flush()
                if m is not None:
                    times[name].append(m.step_time_ms)
                    if m.samples_per_s:
                        rates[name].append(m.samples_per_s)
                print(json.dumps(row), flush=True)
    first_name = entries[0][0]
    first = statistics.median(times[first_name]) if times[first_name] else None
    for name, measured in times.items():
        if not measured:
            print(f"{name}: nothing measured")
            continue
        median = statistics.median(measured)
        vs = "" if first is None else f" ({(median / first - 1) * 100:+.1f} % vs the first)"
        rate = f", {statistics.median(rates[name]):.1f} samples/s" if rates[name] else ""
        print(f"{name}: median {median:.2f} ms of {len(measured)}{vs}{rate}")
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
    p_versus.add_argument(
        "--finder",
        nargs=2,
        metavar=("STORAGE", "STUDY"),
        default=None,
        help="also measure a batch search's batch finder point (issue 46)",
    )
    p_phases = sub.add_parser("phases")
    p_phases.add_argument("--storage", required=True)
    p_phases.add_argument("--study", default=None)
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.out, args.runs_dir)
    if args.command == "versus":
        return versus(
            args.pins,
            rounds=args.rounds,
            out=args.out,
            runs_dir=args.runs_dir,
            finder=args.finder,
        )
    return phases(args.storage, args.study)


if __name__ == "__main__":
    script_main(main)
