"""Reference grid of hand-picked recompute configurations, each measured in a fresh process.

Resumable: every finished configuration is appended to a JSON-lines file, and configurations
already there are skipped, so a grid larger than one 10-minute device command is finished by
running the same command again. Every record carries device, torch version and date.

    python -m benchmarks.reference --set issue2 --out benchmarks/results/llama-h200.jsonl
    python -m benchmarks.reference --set grid --out benchmarks/results/llama-h200.jsonl --gpus 0,1

With ``--gpus 0,1,...`` every GPU measures one configuration at a time (a fresh process that
sees only that GPU), so a grid takes 1/N of the wall time; records are appended as they finish.

Sets (builtin:llama, B=4, T=1024, bf16, AdamW as usually written unless named ``fused``):
    issue2   budgets 1.0, 0.7, 0.5, 0.0 and block AC every 1 and 2 under compile
    grid     eager, eager + full AC, budgets 0.0..1.0 every 0.1, block AC every 1/2/4 with
             the full and op policies, nosac; the same with fused AdamW
    b8       B=8: budget 1.0 as written; fused at budgets 1.0, 0.7, 0.5, 0.3, 0.2 and full AC
    b64      B=64 (L5): budget 1.0, block AC every 1/2 (both optimizers), fused budgets
             0.7..0.1 with and without expandable segments
    vit      builtin:vit: budgets 1.0, 0.7, 0.5, full AC, op policy
    smoke    tiny-gpt on CPU (for tests)
    grid30-NAME  issue 30's hand grid of a transformers workload (benchmarks/grid_vs_search.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from budgettune.trial.launcher import launch_trial
from budgettune.trial.spec import TrialRun, TrialSpec


def _config(label: str, family: str, workload: str, options: dict[str, Any], **spec: Any):
    return {
        "label": label,
        "family": family,
        "workload": workload,
        "options": options,
        "spec": spec,
    }


def configs(name: str, *, warmup: int, timed: int) -> list[dict[str, Any]]:
    """The configurations of one set, in the order they are measured."""
    steps = {"warmup_steps": warmup, "timed_steps": timed}
    llama, vit = "builtin:llama", "builtin:vit"
    out: list[dict[str, Any]] = []
    if name == "issue2":
        for budget in (1.0, 0.7, 0.5, 0.0):
            out.append(
                _config(
                    f"budget-{budget:.1f}",
                    "budget",
                    llama,
                    {},
                    activation_memory_budget=budget,
                    **steps,
                )
            )
        for every in (1, 2):
            out.append(
                _config(f"ac-every-{every}", "block-ac", llama, {}, block_ac_every=every, **steps)
            )
    elif name == "grid":
        out.append(_config("eager", "eager", llama, {}, compile_mode="eager", **steps))
        out.append(
            _config(
                "eager-ac-every-1",
                "eager",
                llama,
                {},
                compile_mode="eager",
                block_ac_every=1,
                **steps,
            )
        )
        for tenth in range(10, -1, -1):
            budget = tenth / 10
            out.append(
                _config(
                    f"budget-{budget:.1f}",
                    "budget",
                    llama,
                    {},
                    activation_memory_budget=budget,
                    **steps,
                )
            )
        for every in (1, 2, 4):
            out.append(
                _config(f"ac-every-{every}", "block-ac", llama, {}, block_ac_every=every, **steps)
            )
        out.append(
            _config(
                "op-sac", "op-policy", llama, {}, block_ac_every=1, block_ac_policy="op", **steps
            )
        )
        out.append(
            _config(
                "nosac",
                "nosac",
                llama,
                {},
                activation_memory_budget=0.99,
                recompute_ops_removed=("aten.add",),
                **steps,
            )
        )
        for every in (2, 4):
            out.append(
                _config(
                    f"op-ac-every-{every}",
                    "op-policy",
                    llama,
                    {},
                    block_ac_every=every,
                    block_ac_policy="op",
                    **steps,
                )
            )
        fused = {"optimizer_impl": "fused", **steps}
        for every in (2, 4):
            out.append(
                _config(
                    f"fused-op-ac-every-{every}",
                    "fused-op-policy",
                    llama,
                    {},
                    block_ac_every=every,
                    block_ac_policy="op",
                    **fused,
                )
            )
        for budget in [tenth / 10 for tenth in range(10, -1, -1)]:
            out.append(
                _config(
                    f"fused-budget-{budget:.1f}",
                    "fused-budget",
                    llama,
                    {},
                    activation_memory_budget=budget,
                    **fused,
                )
            )
        for every in (1, 2, 4):
            out.append(
                _config(
                    f"fused-ac-every-{every}",
                    "fused-block-ac",
                    llama,
                    {},
                    block_ac_every=every,
                    **fused,
                )
            )
        out.append(
            _config(
                "fused-op-sac",
                "fused-op-policy",
                llama,
                {},
                block_ac_every=1,
                block_ac_policy="op",
                **fused,
            )
        )
        out.append(
            _config(
                "fused-nosac",
                "fused-nosac",
                llama,
                {},
                activation_memory_budget=0.99,
                recompute_ops_removed=("aten.add",),
                **fused,
            )
        )
        out.append(_config("fused-eager", "fused-eager", llama, {}, compile_mode="eager", **fused))
    elif name == "b8":
        b8 = {"batch_size": 8}
        # the user's unconstrained baseline at B=8 (L3's slowdown is against it)
        out.append(_config("b8-budget-1.0", "b8-budget", llama, b8, **steps))
        for budget in (1.0, 0.7, 0.5, 0.3, 0.2):
            out.append(
                _config(
                    f"b8-fused-budget-{budget:.1f}",
                    "b8-fused-budget",
                    llama,
                    b8,
                    activation_memory_budget=budget,
                    optimizer_impl="fused",
                    **steps,
                )
            )
        out.append(
            _config(
                "b8-fused-ac-every-1",
                "b8-fused-block-ac",
                llama,
                b8,
                block_ac_every=1,
                optimizer_impl="fused",
                **steps,
            )
        )
    elif name == "b64":
        # L5: B=64 does not fit at budget 1.0 on an H200; full block AC is the hand pick.
        b64 = {"batch_size": 64}
        out.append(_config("b64-budget-1.0", "b64-budget", llama, b64, **steps))
        for impl in ("as_written", "fused"):
            tag = "b64-fused" if impl == "fused" else "b64"
            for every in (1, 2):
                out.append(
                    _config(
                        f"{tag}-ac-every-{every}",
                        f"{tag}-block-ac",
                        llama,
                        b64,
                        block_ac_every=every,
                        optimizer_impl=impl,
                        **steps,
                    )
                )
        for budget in (0.7, 0.5, 0.3, 0.2, 0.1):
            for alloc in ("", "expandable_segments:True"):
                out.append(
                    _config(
                        f"b64-fused-budget-{budget:.1f}{'-expandable' if alloc else ''}",
                        "b64-fused-budget",
                        llama,
                        b64,
                        activation_memory_budget=budget,
                        optimizer_impl="fused",
                        cuda_alloc_conf=alloc,
                        **steps,
                    )
                )
    elif name == "vit":
        for budget in (1.0, 0.7, 0.5):
            out.append(
                _config(
                    f"vit-budget-{budget:.1f}",
                    "budget",
                    vit,
                    {},
                    activation_memory_budget=budget,
                    **steps,
                )
            )
        out.append(_config("vit-ac-every-1", "block-ac", vit, {}, block_ac_every=1, **steps))
        out.append(
            _config(
                "vit-op-sac", "op-policy", vit, {}, block_ac_every=1, block_ac_policy="op", **steps
            )
        )
    elif name == "variants":
        # Which workload definition the pre-project reference measured: tied vs untied LM head,
        # float32 vs bf16 cross entropy (its steady bytes suggest untied).
        for tie in (False,):
            for fp32 in (False, True):
                opts = {"tie_embeddings": tie, "fp32_loss": fp32}
                tag = f"untied-{'fp32' if fp32 else 'bf16'}loss"
                out.append(_config(f"{tag}-budget-1.0", "variant", llama, opts, **steps))
                out.append(
                    _config(f"{tag}-ac-every-1", "variant", llama, opts, block_ac_every=1, **steps)
                )
                out.append(
                    _config(
                        f"{tag}-fused-ac-every-1",
                        "variant",
                        llama,
                        opts,
                        block_ac_every=1,
                        optimizer_impl="fused",
                        **steps,
                    )
                )
                out.append(
                    _config(
                        f"{tag}-fused-budget-0.7",
                        "variant",
                        llama,
                        opts,
                        activation_memory_budget=0.7,
                        optimizer_impl="fused",
                        **steps,
                    )
                )
    elif name == "smoke":
        tiny = {  # eager: the tests of this script are about the loop, not the partitioner
            "compile_backend": "aot_eager_decomp_partition",
            "compile_mode": "eager",
            "warmup_steps": 1,
            "timed_steps": 1,
        }
        out.append(_config("tiny-budget-1.0", "budget", "builtin:tiny-gpt", {}, **tiny))
        out.append(
            _config(
                "tiny-budget-0.2",
                "budget",
                "builtin:tiny-gpt",
                {},
                activation_memory_budget=0.2,
                **tiny,
            )
        )
    elif name.startswith("grid30-"):
        # issue 30's hand grids of transformers workloads (benchmarks/grid_vs_search.py)
        from benchmarks.grid_vs_search import WORKLOADS, grid_configs

        workload = name.removeprefix("grid30-")
        if workload not in WORKLOADS:
            raise SystemExit(f"unknown set {name!r}; grid30- sets: {sorted(WORKLOADS)}")
        out.extend(grid_configs(workload, warmup=warmup, timed=timed))
    else:
        raise SystemExit(f"unknown set {name!r}")
    return out


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
    result = launch_trial(run, run_dir=args.runs_dir / config["label"], timeout_s=args.timeout)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
