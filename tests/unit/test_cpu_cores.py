"""CPU cores by GPU (`budgettune.trial.cpu_cores`) and each worker's sampler stream: what a
search over several GPUs gives each GPU's worker, trials and fresh runs."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from budgettune.study.spec import MAX_SEED
from budgettune.study.study import worker_sampler_seed
from budgettune.trial.cpu_cores import (
    COMPILE_THREADS_ENV,
    CPUS_ENV,
    apply_cpu_share,
    cpu_shares,
    format_cpu_list,
    parse_cpu_list,
    share_env,
)


def test_cpu_lists_read_and_written_as_the_kernel_writes_them() -> None:
    assert format_cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list(format_cpu_list(range(16, 32))) == set(range(16, 32))
    for bad in ("", "3-1", "a", "-1", "0-999999999", "70000"):  # 10^9 CPUs: 22 GB (issue 48)
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_each_gpu_gets_its_own_even_share_and_one_gpu_none() -> None:
    shares = cpu_shares(["cuda:0", "cuda:1", "cuda:2", "cuda:3"] * 4, cores=range(64))
    assert shares == {"cuda:0": "0-15", "cuda:1": "16-31", "cuda:2": "32-47", "cuda:3": "48-63"}
    # sharded groups share by group; an allowed set with holes splits by position
    assert cpu_shares(["cuda:0,1", "cuda:2,3"], cores=[0, 1, 2, 3, 8, 9, 10, 11]) == {
        "cuda:0,1": "0-3",
        "cuda:2,3": "8-11",
    }
    assert cpu_shares(["cuda:0"] * 4, cores=range(16)) == {}  # trials of one GPU: no split
    assert cpu_shares(["cuda:0", "cuda:1", "cuda:2"], cores=range(5)) == {}  # under 2 each


def test_a_process_keeps_to_its_share_and_what_it_starts_inherits_it() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    share = format_cpu_list(allowed[:1])
    code = (
        "import os, subprocess, sys; from budgettune.trial.cpu_cores import apply_cpu_share; "
        "print(sorted(apply_cpu_share())); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, CPUS_ENV: share},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[0] == out[1] == str(allowed[:1])


def test_a_share_that_cannot_be_applied_is_said_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = os.sched_getaffinity(0)
    assert apply_cpu_share({}) is None
    assert apply_cpu_share({CPUS_ENV: "not-a-list"}) is None
    assert apply_cpu_share({CPUS_ENV: "4096-4100"}) is None  # cores this host lacks
    assert os.sched_getaffinity(0) == before
    assert sum(CPUS_ENV in r.getMessage() for r in caplog.records) == 2


def test_workers_of_a_seeded_study_draw_apart() -> None:
    # issue 44: 16 workers made one TPE sampler each with the study's seed, and 12 of their
    # trials were the same configuration
    assert worker_sampler_seed(None, 3) is None
    seeds = [worker_sampler_seed(7, stream) for stream in range(1, 17)]
    assert len(set(seeds)) == 16 and worker_sampler_seed(MAX_SEED, 1) == 0

    def first_draw(seed: int | None) -> float:
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        return study.ask().suggest_float("budget", 0.0, 1.0)

    draws = [first_draw(seed) for seed in seeds]
    assert len(set(draws)) == 16
    assert first_draw(seeds[0]) == draws[0]  # a stream is still reproducible


def test_a_fresh_run_keeps_to_the_share_of_its_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from budgettune.study import fresh
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun

    seen: list[object] = []
    monkeypatch.setattr(fresh, "launch_trial", lambda run, **kw: seen.append(kw["extra_env"]))
    launch = fresh.launcher(60.0, None, {"cuda:0": "0-3", "cuda:1": "4-7"})
    for device in ("cuda:1", "cuda:0", "cuda:2"):
        launch(TrialRun(spec=TrialSpec(), workload="builtin:llama", device=device), tmp_path)
    assert seen == [{CPUS_ENV: "4-7"}, {CPUS_ENV: "0-3"}, None]


def test_trials_sharing_a_gpu_split_its_compile_workers_unless_the_user_set_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Issue 44: four trials a GPU on a 16-core share each started 16 compile workers (torch's
    default, one per core); now each gets its quarter, and a fresh run on that GPU too."""
    from budgettune.study import fresh
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun

    monkeypatch.delenv(COMPILE_THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    assert share_env("0-15", 4) == {CPUS_ENV: "0-15", COMPILE_THREADS_ENV: "4"}
    assert share_env("0-15", 1) == {CPUS_ENV: "0-15"}  # alone on its GPU: torch decides
    assert share_env(None, 4) == {COMPILE_THREADS_ENV: "1"}  # one GPU: this process's cores
    assert share_env("0-2", 5) == {CPUS_ENV: "0-2", COMPILE_THREADS_ENV: "1"}
    assert share_env(None, 1) == {}
    seen: list[object] = []
    monkeypatch.setattr(fresh, "launch_trial", lambda run, **kw: seen.append(kw["extra_env"]))
    launch = fresh.launcher(60.0, None, {"cuda:0": "0-7"}, 2)
    launch(TrialRun(spec=TrialSpec(), workload="builtin:llama", device="cuda:0"), tmp_path)
    assert seen == [{CPUS_ENV: "0-7", COMPILE_THREADS_ENV: "4"}]
    monkeypatch.setenv(COMPILE_THREADS_ENV, "2")  # the user's own: left to torch
    assert share_env("0-15", 4) == {CPUS_ENV: "0-15"}
