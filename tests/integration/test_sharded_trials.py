"""Sharded trials for real: 2 ranks under torch.distributed.run, FSDP2 on CPU with gloo.

Every test starts real processes (torchrun, a supervisor and a measuring child per rank); the
workload is tests/fixtures/rank_faults.py, whose rank 1 can exit or run out of memory on its
3rd forward. About 15-30 s per sharded trial on a 2-core host.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from budgettune.trial.launcher import launch_trial
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = str(ROOT / "tests" / "fixtures" / "rank_faults.py")
CHECK = ROOT / "benchmarks" / "pin_in_job.py"
EAGER = TrialSpec(compile_mode="eager", warmup_steps=2, timed_steps=2)


@pytest.mark.parametrize(
    ("fault", "outcome", "said"),
    [
        ("exit", TrialOutcome.CRASHED, "exited with code 7"),
        ("oom", TrialOutcome.OOM, "OutOfMemoryError: fixture: rank 1 ran out of memory"),
    ],
)
def test_a_failing_rank_ends_the_trial_and_is_named(
    tmp_path: Path, fault: str, outcome: TrialOutcome, said: str
) -> None:
    run = TrialRun(
        spec=EAGER,
        workload=f"{FIXTURE}:build",
        workload_options={"fault": fault, "hook_dir": str(tmp_path)},
        nproc_per_node=2,
        collective_timeout_s=60,
    )
    started = time.monotonic()
    result = launch_trial(run, run_dir=tmp_path, timeout_s=240)
    assert time.monotonic() - started < 200  # torn down, not left hanging to the timeout
    assert result.outcome is outcome, result.error
    assert result.failed_rank == 1 and result.world_size == 2
    assert result.error.startswith("rank 1 of 2: ") and said in result.error
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.ranks[0].outcome is not TrialOutcome.OK  # rank 0 did not finish alone
    stored = json.loads((tmp_path / "RESULT.json").read_text())
    assert stored["failed_rank"] == 1 and len(stored["ranks"]) == 2
    # the workload's own parallelize(model, mesh) sharded it, on both ranks, with a 2-rank mesh
    for rank in (0, 1):
        assert (tmp_path / f"hook.rank{rank}").read_text() == "2"


def test_sharded_search_pins_and_the_pin_reproduces_under_torchrun(tmp_path: Path) -> None:
    """A 2-rank search (compiled, FSDP2, gloo) with per-rank figures everywhere, then the pin
    applied by `load_pinned(...).compile` on each rank of a torchrun training job."""
    storage, pin = tmp_path / "s.db", tmp_path / "pin.json"
    search = subprocess.run(
        [
            sys.executable, "-m", "budgettune", "search",
            "-w", f"{FIXTURE}:build", "-o", "rows=4096",
            "--device", "cpu", "--nproc-per-node", "2", "--max-mem", "1GB",
            "--trials", "1", "--top-k", "1", "--reverify", "1",
            "--backend", "aot_eager_decomp_partition", "--timed-steps", "2",
            "--storage", str(storage), "--runs-dir", str(tmp_path / "runs"),
            "--output", str(pin), "--study", "sharded",
        ],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stdout + search.stderr
    doc = json.loads(pin.read_text())
    assert doc["world_size"] == 2 and doc["sharding"].startswith("fsdp2")
    per_rank = doc["measured"]["per_rank"]
    assert [row["rank"] for row in per_rank] == [0, 1]
    split = doc["measured"]["split"]
    assert split["sharded_state_bytes"] > 0 and split["activation_bytes"] > 0
    trial = optuna.load_study(study_name="sharded", storage=f"sqlite:///{storage}").trials[0]
    assert trial.user_attrs["world_size"] == 2
    ranks = trial.user_attrs["ranks"]
    assert trial.user_attrs["peak_allocated_bytes"] == max(
        r["peak_allocated_bytes"] for r in ranks
    )
    assert trial.user_attrs["step_time_ms"] == max(r["step_time_ms"] for r in ranks)

    show = subprocess.run(
        [sys.executable, "-m", "budgettune", "show", "--storage", str(storage)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert show.returncode == 0, show.stderr
    assert re.search(r"ranks \d+\.\d+, \d+\.\d+ [MG]B;", show.stdout), show.stdout
    assert "2 ranks per trial" in show.stdout

    check = tmp_path / "check.json"
    job = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", str(CHECK), "--pin", str(pin), "--output", str(check),
            "--tolerance", "0.02",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    report = json.loads(check.read_text())
    assert report["world_size"] == 2 and len(report["ranks"]) == 2
    for row in report["ranks"]:
        assert not [w for w in row["warnings"] if "world size" in w]
        # the rank's own figure from the pin, on the pin's metric
        assert row["pinned_peak_bytes"] == per_rank[row["rank"]]["peak_worst_bytes"]
        # activations dominate this workload, so the CPU peak is as stable as on a GPU
        assert abs(row["relative_error"]) <= 0.02, row
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]


def test_a_sharded_trial_offloads_on_every_rank(tmp_path: Path) -> None:
    """Issue 33: offload per rank under FSDP2 (compiled blocks, the hooks around each): every
    rank moves its activations, the host figure adds the ranks up (they share the host)."""
    run = TrialRun(
        spec=TrialSpec(
            compile_backend="aot_eager_decomp_partition", offload_every=1, timed_steps=1
        ),
        workload=f"{FIXTURE}:build",
        workload_options={"rows": 16384},  # 16384 x 32 fp32: 2 MiB per saved activation
        nproc_per_node=2,
        collective_timeout_s=60,
    )
    result = launch_trial(run, run_dir=tmp_path, timeout_s=300)
    assert result.outcome is TrialOutcome.OK, result.error
    m = result.measurement
    assert m is not None and m.offload_bytes >= 2 * 2**20
    # the ranks' host peaks added up: each rank held what it moved (all of it, before its
    # backward), so the sum is at least twice the largest rank's bytes moved when they agree
    assert m.host_peak_bytes >= 2 * m.offload_bytes
