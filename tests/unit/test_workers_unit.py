"""Workers without trials: the per-GPU command, the stored spec, what counts toward a target."""

from __future__ import annotations

import os
import sys
import time

import optuna
import pytest

from budgettune.errors import DeviceUnavailableError, UsageError
from budgettune.study import workers
from budgettune.study.space import SearchSpace
from budgettune.study.spec import SearchSpec
from budgettune.study.target import NextStep, count_trials
from budgettune.trial.spec import TrialSpec

State = optuna.trial.TrialState


def test_worker_command_pins_one_gpu_and_keeps_the_url_off_the_command_line() -> None:
    command = workers.worker_command(study_name="s", gpu=3, runs_dir="/runs")
    assert command == [
        sys.executable, "-m", "budgettune.cli", "worker",
        "--study", "s", "--device", "cuda:3", "--runs-dir", "/runs",
    ]  # fmt: skip
    assert not any("postgresql" in part or "sqlite" in part for part in command)
    assert workers.STORAGE_ENV == "BUDGETTUNE_STORAGE"


def test_check_gpus_without_a_gpu_and_with_a_repeat(monkeypatch) -> None:
    monkeypatch.setattr(workers, "cuda_device_count", lambda: 0)
    with pytest.raises(DeviceUnavailableError, match=r"--gpus 0,1: no CUDA GPU"):
        workers.check_gpus([0, 1])
    with pytest.raises(UsageError, match="each GPU index once"):
        workers.check_gpus([0, 0])


def test_search_spec_round_trips_through_json_without_the_storage_url() -> None:
    spec = SearchSpec(
        workload="builtin:tiny-gpt",
        workload_options={"batch_size": 2},
        max_mem_bytes=125_000_000,
        num_trials=9,
        study_name="s",
        storage_url="postgresql://me:secret@db/tune",
        space=SearchSpace.for_device(
            "cpu", block_ac_every=(0, 2), fixed={"knapsack_solver": "dp"}
        ),
        base=TrialSpec(warmup_steps=1, timed_steps=1),
        sampler_seed=7,
    )
    data = spec.to_json_dict()
    assert "storage_url" not in data and "secret" not in repr(data)
    again = SearchSpec.from_json_dict(data, storage_url="sqlite:///x.db", num_trials=1)
    assert again == spec.replace(storage_url="sqlite:///x.db", num_trials=1)


def _trial(number: int, state: State, **system_attrs: object) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=state, value=1.0 if state == State.COMPLETE else None, system_attrs=system_attrs
    )
    trial.number = number
    return trial


def test_a_retried_stale_trial_does_not_count_but_its_copy_and_crashes_do() -> None:
    trials = [
        _trial(0, State.COMPLETE),
        _trial(1, State.FAIL),  # went stale, re-queued as 3
        _trial(2, State.FAIL),  # crashed in the objective: finished, counts
        _trial(3, State.WAITING, failed_trial=1, retry_history=[1]),
    ]
    count = count_trials(trials, target=3)
    assert (count.counted, count.finished, count.waiting) == (3, 2, 1)
    assert count.next_step() is NextStep.RUN  # the queued copy must run
    trials[3] = _trial(3, State.RUNNING, failed_trial=1, retry_history=[1])
    assert count_trials(trials, target=3).next_step() is NextStep.WAIT
    trials[3] = _trial(3, State.FAIL, failed_trial=1, retry_history=[1])  # stale again: final
    assert count_trials(trials, target=3).next_step() is NextStep.STOP
    assert count_trials(trials, target=4).next_step() is NextStep.RUN


def test_queued_baselines_past_the_target_wait_for_the_next_search() -> None:
    baselines = [_trial(n, State.WAITING) for n in range(3)]
    assert count_trials(baselines, target=2).next_step() is NextStep.RUN
    baselines[:2] = [_trial(0, State.COMPLETE), _trial(1, State.COMPLETE)]
    assert count_trials(baselines, target=2).next_step() is NextStep.STOP


def test_trials_per_gpu_starts_that_many_workers_on_each_gpu(monkeypatch, tmp_path) -> None:
    """--trials-per-gpu 2 on GPUs 0 and 1: two workers on each, one log each, each worker
    its own sampler stream and its GPU's share of the cores."""
    from budgettune.study.study import SAMPLER_STREAM_ENV, SearchObserver
    from budgettune.study.target import TrialCount
    from budgettune.trial.cpu_cores import COMPILE_THREADS_ENV, CPUS_ENV

    monkeypatch.delenv(COMPILE_THREADS_ENV, raising=False)
    started: list[list[str]] = []
    envs: list[dict[str, str]] = []

    class Done:
        returncode = 0

        def poll(self) -> int:
            return 0

    def spawn(command, *, output, env):
        started.append(list(command))
        envs.append(env)
        return Done()

    class Watch:
        def count(self) -> TrialCount:
            return TrialCount(target=4, counted=4, finished=4, waiting=0, running=0)

        def best_feasible_ms(self) -> float | None:
            return None

    monkeypatch.setattr(workers, "spawn", spawn)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    search = SearchSpec(
        workload="builtin:llama",
        device="cuda:0",
        max_mem_bytes=10**10,
        study_name="s",
        space=SearchSpace.for_device("cuda"),
        runs_dir=str(tmp_path),
        trials_per_gpu=2,
    )
    workers.run_gpu_workers(
        Watch(), [0, 1], search=search, storage_url="sqlite:///x.db", observer=SearchObserver()
    )
    devices = [command[command.index("--device") + 1] for command in started]
    assert sorted(devices) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    # issue 44: 16 workers seeded alike ran one configuration 12 times
    given = [
        (d, env[SAMPLER_STREAM_ENV], env[CPUS_ENV], env[COMPILE_THREADS_ENV])
        for d, env in zip(devices, envs)
    ]  # and the two trials of a GPU split its 4 cores' compile workers
    assert given == [
        ("cuda:0", "1", "0-3", "2"),
        ("cuda:0", "2", "0-3", "2"),
        ("cuda:1", "3", "4-7", "2"),
        ("cuda:1", "4", "4-7", "2"),
    ]
    logs = sorted(p.name for p in (tmp_path / "s" / "workers").iterdir())
    assert logs == ["cuda0-2.log", "cuda0.log", "cuda1-2.log", "cuda1.log"]


def test_the_search_goes_on_when_its_trials_are_done_not_when_its_workers_have_exited(
    monkeypatch, tmp_path
) -> None:
    """Issue 44: workers closing their trial servers took 4-6 s before the re-verification
    could start; the search goes on once every trial has finished, and its caller hears of
    each poll (the fresh runs' servers, the early runs: test_early_round.py)."""
    from budgettune.study.study import SearchObserver
    from budgettune.study.target import TrialCount

    reaped: list[int] = []

    class Exiting:  # a worker past the target, still closing down
        returncode = None

        def __init__(self, n: int) -> None:
            self.n = n

        def poll(self) -> None:
            return None

        def wait(self, timeout: float | None = None) -> int:
            reaped.append(self.n)
            return 0

    made: list[Exiting] = []

    def spawn(command, *, output, env):
        made.append(Exiting(len(made)))
        return made[-1]

    counts = iter(
        [
            TrialCount(target=2, counted=0, finished=0, waiting=0, running=0),  # at the start
            TrialCount(target=2, counted=2, finished=0, waiting=0, running=2),
            TrialCount(target=2, counted=2, finished=1, waiting=0, running=1),
            TrialCount(target=2, counted=2, finished=1, waiting=0, running=1),
            TrialCount(target=2, counted=2, finished=2, waiting=0, running=0),
            TrialCount(target=2, counted=2, finished=2, waiting=0, running=0),  # the end
        ]
    )

    class Watch:
        def count(self) -> TrialCount:
            return next(counts)

        def best_feasible_ms(self) -> float | None:
            return None

    warmed: list[int] = []
    monkeypatch.setattr(workers, "spawn", spawn)
    monkeypatch.setattr(workers, "PROGRESS_POLL_S", 0.0)
    search = SearchSpec(
        workload="builtin:llama",
        device="cuda:0",
        max_mem_bytes=10**10,
        study_name="s",
        space=SearchSpace.for_device("cuda"),
        runs_dir=str(tmp_path),
    )
    finished = workers.run_gpu_workers(
        Watch(),
        [0, 1],
        search=search,
        storage_url="sqlite:///x.db",
        observer=SearchObserver(),
        on_poll=lambda count: warmed.append(count.finished),
    )
    assert finished == 2
    assert warmed == [0, 1, 1, 2]  # after each poll, in the search's thread
    assert next(counts, None) is None  # it stopped polling at the last trial's end
    deadline = time.monotonic() + 5
    while sorted(reaped) != [0, 1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(reaped) == [0, 1]  # the exiting workers are reaped by a thread
