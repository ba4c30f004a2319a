"""Which import keeps a forked child from starting CUDA (issue 44: the trial servers refused on
the GPU hosts because importing the compiler loaded the CUDA driver).

    python -m benchmarks.fork_cuda_probe --out probe.json

For each environment (as is, and with PYTORCH_NVML_BASED_CUDA_CHECK=1, which makes
``torch.cuda.is_available`` ask NVML instead of the CUDA driver) a fresh process imports the
trial server's modules one by one; after each it records whether libcuda is loaded, whether
torch initialised CUDA, and whether a child forked then can make a CUDA context; and the
stacks of every call of ``torch._C._cuda_getDeviceCount`` (the driver's cuInit) during them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import script_main

_PROBE = r"""
import importlib, json, os, sys, traceback
import torch
from budgettune.trial.forkserver import COMPILER_MODULES, _fork_can_start_cuda

calls = []
_count = getattr(torch._C, "_cuda_getDeviceCount", None)  # absent from CPU builds
def _traced():
    calls.append("".join(traceback.format_stack(limit=14)[:-1]))
    return _count()
if _count is not None:
    torch._C._cuda_getDeviceCount = _traced

def loaded():
    with open("/proc/self/maps") as maps:
        return any("libcuda.so" in line for line in maps)

steps = []
for name in COMPILER_MODULES + tuple(sys.argv[1:]):
    try:
        importlib.import_module(name)
        error = ""
    except Exception as exc:
        error = repr(exc)[:200]
    step = {"module": name, "error": error, "libcuda": loaded(),
            "initialized": torch.cuda.is_initialized(), "getDeviceCount_calls": len(calls)}
    if step["libcuda"] and not step["initialized"]:
        step["fork_can_start_cuda"] = _fork_can_start_cuda()
    steps.append(step)
    if step["initialized"] or step.get("fork_can_start_cuda") is False:
        break
print(json.dumps({"steps": steps, "stacks": calls[:3]}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("modules", nargs="*", help="more modules to import after the server's")
    args = parser.parse_args(argv)
    found = {}
    for label, extra in (("as-is", {}), ("nvml-check", {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, *args.modules],
            env={**os.environ, **extra}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        try:
            found[label] = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            found[label] = {"exit": done.returncode, "stderr": done.stderr[-2000:]}
        steps = found[label].get("steps")
        print(f"{label}: " + (f"last import {steps[-1]}" if steps else f"failed: {found[label]}"),
              flush=True)  # fmt: skip
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    script_main(main)
