"""The CPU memory figure agrees with the process's RSS high-water mark (DESIGN.md §4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Run in a fresh process with glibc's mmap threshold at 64 KiB, so every tensor above it is its
# own mapping, returned to the OS on free: then RSS tracks the allocator's live bytes.
SCRIPT = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from recompute_models import tiny_lm_workload
from budgettune.trial import measure, recompute
from budgettune.trial.spec import TrialSpec

def status_bytes(key):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

out = []
for budget in (1.0, 0.3):
    torch._dynamo.reset()
    workload = tiny_lm_workload(vocab=2048, dim=128, heads=4, layers=2, seq=256, batch=12)
    spec = TrialSpec(compile_backend="aot_eager_decomp_partition",
                     activation_memory_budget=budget)
    step = recompute.prepare(workload, spec, torch.device("cpu"))
    measure.warm_up(step, spec)
    rss = {}

    def window_start():
        rss["before"] = status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # reset VmHWM to the current RSS

    def window_end():
        rss["hwm"] = status_bytes("VmHWM")

    window = measure.profile_cpu_step(step, on_window_start=window_start,
                                      on_window_end=window_end)
    out.append({"budget": budget, "profiler_bytes": window.window_peak_bytes,
                "rss_delta_bytes": rss["hwm"] - rss["before"]})
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_peak_agrees_with_rss_high_water_mark() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    models = str(Path(__file__).parents[1] / "unit")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, models],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for row in rows:
        print(row)
        assert row["profiler_bytes"] > 50e6  # large enough that fixed overheads are noise
        # Measured: 0.28% / 0.05% here (native Linux, torch 2.13); 0.80% / 1.07% on a gVisor
        # H200 host with torch 2.11 (profiler above RSS by ~1 MB there); 2.03% on the 2-core CI
        # host (profiler above RSS by 1.8 MB: bytes allocated whose pages were never touched).
        assert row["profiler_bytes"] == pytest.approx(row["rss_delta_bytes"], rel=0.03), row
    assert rows[1]["profiler_bytes"] < rows[0]["profiler_bytes"]
