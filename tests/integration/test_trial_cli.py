"""Issue 2's acceptance: `budgettune trial ... --json` on the CPU tiny GPT, as a user types it
(real CLI subprocess), at budget 1.0 and 0.2. The codegen-free backend runs the same
partitioner (the budget is its knob) without inductor's ~25 s compile per trial on 2 cores;
tests/integration/test_compile_cache.py runs inductor itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The console script beside the interpreter running the tests: the venv need not be activated
# (a bare `budgettune` from PATH is found only when it is).
BUDGETTUNE = str(Path(sys.executable).parent / "budgettune")


def _trial(tmp_path: Path, budget: str) -> dict:
    out = subprocess.run(
        [BUDGETTUNE, "trial", "--workload", "builtin:tiny-gpt", "--budget", budget, "--json",
         "--backend", "aot_eager_decomp_partition", "--warmup-steps", "1", "--timed-steps", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # --json: the TrialResult document alone on stdout


def test_budget_02_peaks_clearly_below_budget_1(tmp_path: Path) -> None:
    full, low = _trial(tmp_path, "1.0"), _trial(tmp_path, "0.2")
    assert full["outcome"] == "ok" and low["outcome"] == "ok"
    full_peak = full["measurement"]["peak_device_bytes"]
    low_peak = low["measurement"]["peak_device_bytes"]
    # measured on torch 2.13 CPU: ~141 MB vs ~100 MB
    assert low_peak < 0.85 * full_peak, (low_peak, full_peak)
    assert Path(full["log_path"]).is_file()
