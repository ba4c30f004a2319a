"""Issue 29: `budgettune trial --device cpu --timeout N`, while another process holds the host's
CPU-trial lock, says so in one line without -v and gives up after N seconds, naming the lock
and its holder. One real CLI subprocess; no trial child starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from budgettune.trial.cpu_lock import CPU_LOCK_ENV, cpu_trial_lock


def test_a_cpu_trial_waits_for_the_lock_no_longer_than_its_timeout(
    tmp_path: Path, monkeypatch
) -> None:
    lock = tmp_path / "cpu.lock"
    monkeypatch.setenv(CPU_LOCK_ENV, str(lock))
    env = {**os.environ, "COLUMNS": "400"}
    with cpu_trial_lock():  # this test process is the holder
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "budgettune.cli", "trial", "--device", "cpu",
             "--timeout", "2", "--run-dir", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    assert elapsed < 20, elapsed  # start-up plus the 2 s wait, not an unbounded one
    lines = out.stderr.strip().splitlines()
    waiting = [line for line in lines if "waiting up to 2 s for the CPU-trial lock" in line]
    assert len(waiting) == 1 and str(lock) in waiting[0], out.stderr
    assert f"held by pid {os.getpid()}" in waiting[0]
    assert lines[-1].startswith("error: trial timeout: waited 2 s for the CPU-trial lock")
    assert f"held by pid {os.getpid()}" in lines[-1]
    assert not (tmp_path / "run" / "RESULT.json").exists()
