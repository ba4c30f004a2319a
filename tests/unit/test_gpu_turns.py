"""Trials sharing a GPU take turns (`budgettune.trial.gpu_turns`), checked on the CPU with a
lock named for the test: one holder at a time across processes, the lock given up exactly
while torch compiles, the other trials paused (and resumed) around a measurement, a trial that
died while measuring leaves nobody paused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from budgettune.errors import SpecError, UsageError
from budgettune.trial.gpu_turns import PAUSED_FILE, GpuTurns, resume_paused
from budgettune.trial.phases import PhaseClock
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _sleeper() -> subprocess.Popen[bytes]:
    """Another "trial": a process leading its own session, as each trial child does."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


def _turns(tmp_path: Path, gpu_id: str, *, compile_apart: bool = False) -> GpuTurns:
    import torch

    return GpuTurns(
        torch.device("cpu"),
        clock=PhaseClock(),
        run_dir=tmp_path,
        compile_apart=compile_apart,
        gpu_id=gpu_id,
    )


_HOLDER = """
import sys, time, torch
from pathlib import Path
from budgettune.trial.gpu_turns import GpuTurns
from budgettune.trial.phases import PhaseClock
turns = GpuTurns(torch.device("cpu"), clock=PhaseClock(), run_dir=Path(sys.argv[2]),
                 compile_apart=False, gpu_id=sys.argv[1])
turns.take()
print("taken", flush=True)
time.sleep(float(sys.argv[3]))
turns.close()
"""


def test_one_process_at_a_time_holds_the_gpu_and_the_wait_is_counted(tmp_path: Path) -> None:
    gpu = f"test-{uuid.uuid4().hex}"
    turns = _turns(tmp_path, gpu)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, gpu, str(tmp_path), "3"], stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"taken"
    started = time.monotonic()
    turns.take()
    waited = time.monotonic() - started
    holder.wait()
    assert waited > 1.5 and turns.held
    assert turns.clock.seconds()["gpu_wait"] == pytest.approx(waited, abs=0.05)
    turns.close()


def test_the_gpu_is_given_up_exactly_while_torch_compiles(tmp_path: Path) -> None:
    import torch

    turns = _turns(tmp_path, f"test-{uuid.uuid4().hex}", compile_apart=True)
    events: list[str] = []
    give, take = turns.give, turns.take
    turns.give = lambda: (events.append("give"), give())[-1]  # type: ignore[method-assign]
    turns.take = lambda: (events.append("take"), take())[-1]  # type: ignore[method-assign]
    turns.take()
    events.clear()

    @torch.compile(backend="aot_eager")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    double(torch.ones(3, requires_grad=True)).sum().backward()
    assert events[:2] == ["give", "take"] and turns.held
    events.clear()
    double(torch.ones(3, requires_grad=True)).sum().backward()  # compiled: it only runs
    assert events == [] and turns.held
    turns.close()
    torch._dynamo.reset()


def test_a_measurement_pauses_the_other_trials_and_resumes_them(tmp_path: Path) -> None:
    gpu = f"test-{uuid.uuid4().hex}"
    other = _sleeper()
    gone = _sleeper()
    try:
        turns = _turns(tmp_path, gpu)
        # the others joined the same GPU's turns (each writes its group and start time)
        from budgettune.trial.gpu_turns import _start_time

        (turns.members / str(other.pid)).write_text(_start_time(other.pid) or "")
        (turns.members / str(gone.pid)).write_text("1")  # an id now someone else's: skipped
        with turns.alone():
            time.sleep(0.3)
            assert _state(other.pid) == "T"
            assert _state(gone.pid) != "T"
            assert json.loads((tmp_path / PAUSED_FILE).read_text()) == [other.pid]
        time.sleep(0.3)
        assert _state(other.pid) != "T"
        assert not (tmp_path / PAUSED_FILE).exists()
        assert not (turns.members / str(gone.pid)).exists()  # the stale entry is cleared
        turns.close()
        assert not (turns.members / str(turns.group)).exists()
    finally:
        for process in (other, gone):
            process.kill()
            process.wait()


def test_the_launcher_resumes_whom_a_killed_trial_left_paused(tmp_path: Path) -> None:
    other = _sleeper()
    try:
        os.killpg(other.pid, 19)  # SIGSTOP, as a measuring trial does
        time.sleep(0.2)
        assert _state(other.pid) == "T"
        (tmp_path / PAUSED_FILE).write_text(json.dumps([other.pid]))
        resume_paused(tmp_path)
        time.sleep(0.2)
        assert _state(other.pid) != "T"
        assert not (tmp_path / PAUSED_FILE).exists()
        resume_paused(tmp_path)  # nothing left to do: no error
    finally:
        other.kill()
        other.wait()


def test_only_one_rank_cuda_trials_share_a_gpu() -> None:
    spec = TrialSpec()
    assert TrialRun(spec=spec, workload="builtin:llama", device="cuda", shared_gpu=True)
    with pytest.raises(SpecError, match="one-rank CUDA"):
        TrialRun(spec=spec, workload="builtin:tiny-gpt", device="cpu", shared_gpu=True)
    with pytest.raises(SpecError, match="one-rank CUDA"):
        TrialRun(
            spec=spec, workload="builtin:llama", device="cuda", nproc_per_node=2,
            shared_gpu=True,
        )  # fmt: skip
    run = TrialRun(spec=spec, workload="builtin:llama", device="cuda:1", shared_gpu=True)
    assert TrialRun.from_json_dict(run.to_json_dict()) == run


def test_trials_per_gpu_is_a_search_setting_that_shares_the_gpu() -> None:
    from budgettune.study.space import SearchSpace
    from budgettune.study.spec import SearchSpec

    def search(**values: object) -> SearchSpec:
        return SearchSpec(
            workload="builtin:llama",
            max_mem_bytes=10**10,
            study_name="s",
            space=SearchSpace.for_device("cuda"),
            **values,  # type: ignore[arg-type]
        )

    shared = search(device="cuda", trials_per_gpu=3)
    assert shared.trial_run(TrialSpec()).shared_gpu
    assert not search(device="cuda").trial_run(TrialSpec()).shared_gpu
    with pytest.raises(UsageError, match="needs --device cuda"):
        search(device="cpu", trials_per_gpu=2)
    with pytest.raises(UsageError, match="from 1 to 8"):
        search(device="cuda", trials_per_gpu=0)
    assert SearchSpec.from_json_dict(shared.to_json_dict()) == shared
