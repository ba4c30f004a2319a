"""Re-measurements go to every GPU of the search at once (issue 10), one run per GPU at a
time, results in the order asked; on one device they run one after another."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from budgettune.study.fresh import COLD_CACHES, FreshJob, run_batch
from budgettune.trial.environment import prepare_process_environment
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


def _jobs(n: int) -> list[FreshJob]:
    return [
        FreshJob(spec=TrialSpec(seed=i), number=i, run_name=f"reverify-{i:04d}", phase=f"job {i}")
        for i in range(n)
    ]


class _Launcher:
    """Records which device ran what, and how many runs overlapped on each device."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: dict[str, int] = {}
        self.most_at_once = 0
        self.most_per_device = 0
        self.seen: list[tuple[str, str]] = []

    def __call__(self, run: TrialRun, run_dir: Path) -> TrialResult:
        with self.lock:
            self.busy[run.device] = self.busy.get(run.device, 0) + 1
            self.most_per_device = max(self.most_per_device, self.busy[run.device])
            self.most_at_once = max(self.most_at_once, sum(self.busy.values()))
            self.seen.append((run.device, run_dir.name))
        time.sleep(0.05)
        with self.lock:
            self.busy[run.device] -= 1
        return TrialResult(outcome=TrialOutcome.CRASHED, error=f"{run.spec.seed}:{run_dir.name}")


def _make_run(spec: TrialSpec) -> TrialRun:
    return TrialRun(spec=spec, workload="builtin:tiny-gpt", device="cuda")


def test_runs_spread_over_every_device_one_at_a_time_each(tmp_path: Path) -> None:
    launch = _Launcher()
    phases: list[str] = []
    results = run_batch(
        _jobs(3), runs=2, make_run=_make_run, runs_dir=tmp_path,
        devices=("cuda:0", "cuda:1"), launch=launch, on_phase=phases.append,
    )  # fmt: skip
    # in the order asked, whatever order they finished in
    assert [[r.error for r in rs] for rs in results] == [
        [f"{i}:reverify-{i:04d}-{repeat}" for repeat in range(2)] for i in range(3)
    ]
    assert {device for device, _ in launch.seen} == {"cuda:0", "cuda:1"}
    assert launch.most_at_once == 2 and launch.most_per_device == 1
    assert phases[-1].endswith("6 runs on 2 devices (6/6)")


def test_progress_counts_runs_and_slots_in_words(tmp_path: Path) -> None:
    # one GPU of four trial slots re-measuring one reference: not "1 runs on 4 devices"
    phases: list[str] = []
    run_batch(
        _jobs(1), runs=1, make_run=_make_run, runs_dir=tmp_path,
        devices=("cuda:0",) * 4, launch=_Launcher(), on_phase=phases.append,
    )  # fmt: skip
    assert phases[-1].endswith(": 1 run on 4 slots of 1 device (1/1)")


def test_one_device_runs_one_after_another_on_the_searchs_device(tmp_path: Path) -> None:
    launch = _Launcher()
    phases: list[str] = []
    results = run_batch(
        _jobs(2), runs=2, make_run=_make_run, runs_dir=tmp_path,
        devices=(), launch=launch, on_phase=phases.append,
    )  # fmt: skip
    assert [len(rs) for rs in results] == [2, 2]
    assert launch.most_at_once == 1 and {d for d, _ in launch.seen} == {"cuda"}
    assert phases == ["job 0 (1/2)", "job 0 (2/2)", "job 1 (1/2)", "job 1 (2/2)"]


def test_each_result_is_finished_in_order_as_it_comes_and_missing_runs_only(
    tmp_path: Path,
) -> None:
    """`finish` (the numerics check and the storage write) sees each run in the order asked,
    in the calling thread; per-job counts run only what is missing, in the next run folders."""
    for devices in ((), ("cuda:0", "cuda:1")):
        launch = _Launcher()
        finished: list[tuple[int, str, str]] = []

        def finish(index: int, result: TrialResult) -> TrialResult:
            finished.append((index, result.error, threading.current_thread().name))
            return TrialResult(outcome=TrialOutcome.TIMEOUT, error=f"checked {result.error}")

        results = run_batch(
            _jobs(3), runs=[2, 0, 1], make_run=_make_run, runs_dir=tmp_path / str(len(devices)),
            devices=devices, launch=launch, on_phase=lambda _: None, finish=finish,
            first_repeat=[3, 5, 4],
        )  # fmt: skip
        assert [(i, e) for i, e, _ in finished] == [
            (0, "0:reverify-0000-3"), (0, "0:reverify-0000-4"), (2, "2:reverify-0002-4"),
        ]  # fmt: skip
        assert {thread for _, _, thread in finished} == {threading.main_thread().name}
        assert [[r.error for r in rs] for rs in results] == [
            ["checked 0:reverify-0000-3", "checked 0:reverify-0000-4"], [],
            ["checked 2:reverify-0002-4"],
        ]  # fmt: skip
        assert len(launch.seen) == 3


def test_a_cold_run_is_a_new_process_the_others_fork_from_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job on a fresh host is a new Python process: the cold run is one too (in two
    searches a low-budget point's cold run forked from a server compiled a program 0.8 GB
    lighter than five new processes did), the later runs fork from the search's servers."""
    from budgettune.study import fresh

    servers = object()
    served: list[tuple[str, object]] = []

    def launch_trial(run, *, run_dir, timeout_s, servers, extra_env):  # type: ignore[no-untyped-def]
        served.append((run_dir.name, servers))
        return TrialResult(outcome=TrialOutcome.CRASHED, error="")

    monkeypatch.setattr(fresh, "launch_trial", launch_trial)
    launch = fresh.launcher(60.0, servers)  # type: ignore[arg-type]
    study_root = str(tmp_path / "compile-cache")
    cold, warm = dataclasses.replace(_jobs(1)[0], cold=True), _jobs(2)[1]
    run_batch(
        [cold, warm], runs=2, runs_dir=tmp_path, devices=(), launch=launch,
        on_phase=lambda _: None,
        make_run=lambda spec: dataclasses.replace(_make_run(spec), cache_root=study_root),
    )  # fmt: skip
    assert served == [
        ("reverify-0000-0", None),  # cold: a new process
        ("reverify-0000-1", servers),
        (f"{warm.run_name}-0", servers),
        (f"{warm.run_name}-1", servers),
    ]
    # on a CPU a cold run forks too (one program either way there, and a new process cost
    # the CPU demo 18 %)
    served.clear()
    run_batch(
        [cold], runs=1, runs_dir=tmp_path, devices=(), launch=launch, on_phase=lambda _: None,
        make_run=lambda spec: dataclasses.replace(
            _make_run(spec), device="cpu", cache_root=study_root
        ),
    )  # fmt: skip
    assert served == [("reverify-0000-0", servers)]


def test_a_cold_run_has_compile_caches_of_its_own_triton_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold start's caches are its own and empty, Triton's too, as a job's on a fresh host;
    its later runs use the study's. Issue 44 tried keeping the study's Triton cache for it:
    one such run compiled another program (0.8 GB lighter, 8 % slower) than its siblings and
    the cold job, and the pin understated the job's peak by 0.9 %."""
    seen: list[TrialRun] = []

    def launch(run: TrialRun, run_dir: Path) -> TrialResult:
        seen.append(run)
        return TrialResult(outcome=TrialOutcome.CRASHED, error="")

    study_root = str(tmp_path / "compile-cache")
    cold = dataclasses.replace(_jobs(1)[0], cold=True)
    run_batch(
        [cold], runs=2, runs_dir=tmp_path, devices=(), launch=launch, on_phase=lambda _: None,
        make_run=lambda spec: dataclasses.replace(_make_run(spec), cache_root=study_root),
    )  # fmt: skip
    first, second = seen
    own = str(tmp_path / "reverify-0000-0" / COLD_CACHES)
    assert (first.cache_root, second.cache_root) == (own, study_root)
    for run, root in ((first, own), (second, study_root)):
        for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            monkeypatch.setenv(name, "")  # restored after the test
        assert prepare_process_environment(run) is True  # both start empty here
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == run.cache_dir()
        assert os.environ["TRITON_CACHE_DIR"] == f"{root}/triton"
