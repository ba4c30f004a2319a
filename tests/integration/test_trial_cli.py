"""Issue 2's acceptance: `budgettune trial ... --json` on the CPU tiny GPT, as a user types it
(real CLI subprocess), at budget 1.0 and 0.2. The codegen-free backend runs the same
partitioner (the budget is its knob) without inductor's ~25 s compile per trial on 2 cores;
tests/integration/test_compile_cache.py runs inductor itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from budgettune.trial.cpu_lock import CPU_LOCK_ENV

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


def test_sigterm_is_one_line_exit_143_and_the_trial_process_ends(tmp_path: Path) -> None:
    """Issue 29, item 6: SIGTERM behaves like Ctrl-C (it printed nothing and left the trial
    RUNNING); here a trial whose workload hangs in its build."""
    workload = f"{Path(__file__).parents[1] / 'fixtures' / 'faulty_workloads.py'}:hangs"
    env = {**os.environ, CPU_LOCK_ENV: str(tmp_path / "cpu.lock")}  # no wait for other tests
    process = subprocess.Popen(
        [BUDGETTUNE, "trial", "--workload", workload, "--device", "cpu",
         "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    child = ["pgrep", "-f", f"budgettune.trial.child {tmp_path}"]
    deadline = time.monotonic() + 120
    while subprocess.run(child, capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and process.poll() is None, "no trial child started"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert err.strip().splitlines() == ["interrupted; finished work is kept"]
    assert subprocess.run(child, capture_output=True, text=True).stdout == ""  # ended with it
