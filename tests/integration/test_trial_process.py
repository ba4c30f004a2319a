"""Real subprocess trials: outcomes, isolation, the parent never importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from budgettune.trial.launcher import launch_trial
from budgettune.trial.phases import PHASES
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "faulty_workloads.py"
FAST = TrialSpec(compile_backend="aot_eager_decomp_partition", warmup_steps=1, timed_steps=2)


def _run(tmp_path: Path, workload: str, *, timeout_s: float = 120.0, spec: TrialSpec = FAST):
    run = TrialRun(spec=spec, workload=workload, device="cpu", cache_root=None)
    return launch_trial(run, run_dir=tmp_path / "trial", timeout_s=timeout_s)


def test_tiny_gpt_trial_is_ok_and_measured(tmp_path: Path) -> None:
    result = _run(tmp_path, "builtin:tiny-gpt")
    assert result.outcome is TrialOutcome.OK, result.error
    m = result.measurement
    assert m is not None
    assert m.peak_allocated_bytes > m.steady_bytes > 0
    assert m.step_time_ms > 0 and m.compile_s > 0
    assert result.workload_fingerprint is not None
    assert result.workload_fingerprint["param_count"] > 0
    written = json.loads((tmp_path / "trial" / "RESULT.json").read_text())
    assert written["outcome"] == "ok"
    # the log says where the wall time went, the launcher's start and end included
    log = Path(result.log_path).read_text()
    stages = [
        "launcher: starting",
        "torch and its compiler imported in",
        "workload built in",
        "step prepared in",
        "measured (first step",
        "outcome ok",
        "the child ended (0) after",
    ]
    positions = [log.find(stage) for stage in stages]
    assert -1 not in positions and positions == sorted(positions), log
    # ... and so do the result's phases, which add up to its wall time
    phases = result.phases_s
    assert list(phases) == [p for p in PHASES if p in phases]
    assert {"start", "imports", "build", "prepare", "compile", "measure", "exit"} <= set(phases)
    assert "cuda_init" not in phases and "gpu_wait" not in phases  # a CPU trial
    assert phases["compile"] == pytest.approx(m.compile_s, abs=0.05)
    assert sum(phases.values()) == pytest.approx(result.wall_s, abs=0.01)
    assert written["phases_s"] == {k: v for k, v in phases.items() if k != "exit"}


def test_helper_processes_the_trial_left_behind_are_ended(tmp_path: Path) -> None:
    """The child leaves without the interpreter's teardown (`os._exit`, seconds per run on a
    GPU host); whatever it started in its session goes with it."""
    marker = f"budgettune-helper-{tmp_path.name}"
    run = TrialRun(
        spec=FAST,
        workload=f"{FIXTURES}:leaves_a_helper",
        workload_options={"marker": marker},
        device="cpu",
        cache_root=None,
    )
    result = launch_trial(run, run_dir=tmp_path / "trial", timeout_s=120)
    assert result.outcome is TrialOutcome.OK, result.error
    deadline = time.monotonic() + 10
    while True:
        survivors = subprocess.run(
            ["pgrep", "-f", marker], capture_output=True, text=True, check=False
        ).stdout.split()
        if not survivors or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert survivors == []


def test_build_that_raises_is_crashed_with_one_line_and_traceback_in_log(tmp_path: Path) -> None:
    result = _run(tmp_path, f"{FIXTURES}:raises")
    assert result.outcome is TrialOutcome.CRASHED
    assert "\n" not in result.error
    assert "bad hidden size 7" in result.error
    log = Path(result.log_path).read_text()
    assert "Traceback" in log and "faulty_workloads.py" in log


@pytest.mark.parametrize("fn", ["segfaults", "exits"])
def test_dying_worker_is_crashed_and_parent_goes_on(tmp_path: Path, fn: str) -> None:
    result = _run(tmp_path, f"{FIXTURES}:{fn}")
    assert result.outcome is TrialOutcome.CRASHED
    assert "without writing a result" in result.error
    if fn == "segfaults":
        assert "SIGSEGV" in result.error
    # the parent keeps going: the next trial in the same folder works
    again = _run(tmp_path, f"{FIXTURES}:raises")
    assert again.outcome is TrialOutcome.CRASHED and "bad hidden size" in again.error


def test_hanging_worker_times_out_and_its_tree_is_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run(tmp_path, f"{FIXTURES}:hangs", timeout_s=8)
    assert result.outcome is TrialOutcome.TIMEOUT
    assert time.monotonic() - started < 60
    spec_path = str(tmp_path / "trial" / "SPEC.json")
    survivors = subprocess.run(
        ["pgrep", "-f", spec_path], capture_output=True, text=True, check=False
    ).stdout.split()
    assert survivors == []


def test_non_workload_return_is_crashed(tmp_path: Path) -> None:
    result = _run(tmp_path, f"{FIXTURES}:not_a_workload")
    assert result.outcome is TrialOutcome.CRASHED
    assert "Workload" in result.error


def test_parent_never_imports_torch(tmp_path: Path) -> None:
    """The launcher and CLI modules measure a trial without torch in the parent process."""
    code = f"""
import sys
from budgettune.trial.launcher import launch_trial
from budgettune.trial.phases import PHASES
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun
import budgettune.cli, budgettune.workload, budgettune.trial.results
run = TrialRun(spec=TrialSpec(compile_backend="aot_eager_decomp_partition", warmup_steps=1,
               timed_steps=1), workload="{FIXTURES}:raises", device="cpu")
result = launch_trial(run, run_dir={str(tmp_path / "t")!r}, timeout_s=120)
assert result.outcome.value == "crashed", result
assert "torch" not in sys.modules, "parent imported torch"
print("parent-clean")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "parent-clean" in out.stdout


def test_unreadable_spec_file_gives_crashed_result(tmp_path: Path) -> None:
    spec = tmp_path / "SPEC.json"
    spec.write_text("{not json")
    result_path = tmp_path / "RESULT.json"
    subprocess.run(
        [sys.executable, "-m", "budgettune.trial.child", str(spec), str(result_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    data = json.loads(result_path.read_text())
    assert data["outcome"] == "crashed" and "unreadable" in data["error"]


def test_a_run_folder_with_planted_links_never_writes_through_them(tmp_path: Path) -> None:
    """Issue 48: ``SPEC.json`` and ``trial.log`` planted in a run folder as links to files
    elsewhere: the spec replaces its link (written beside, renamed), never the target, and a
    linked log is refused (``O_NOFOLLOW``) before any child starts."""
    folder, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    spec_target, log_target = elsewhere / "precious.json", elsewhere / "notes.txt"
    spec_target.write_text("precious")
    log_target.write_text("notes")
    (folder / "SPEC.json").symlink_to(spec_target)
    run = TrialRun(spec=FAST, workload=f"{FIXTURES}:raises", device="cpu", cache_root=None)
    result = launch_trial(run, run_dir=folder, timeout_s=120)
    assert result.outcome is TrialOutcome.CRASHED and "bad hidden size" in result.error
    assert spec_target.read_text() == "precious"
    assert not (folder / "SPEC.json").is_symlink()  # the link itself was replaced
    linked = tmp_path / "run2"
    linked.mkdir()
    (linked / "trial.log").symlink_to(log_target)
    with pytest.raises(Exception, match="trial.log") as caught:
        launch_trial(run, run_dir=linked, timeout_s=120)
    assert "Traceback" not in str(caught.value) and "\n" not in str(caught.value)
    assert log_target.read_text() == "notes"
