"""Workers on one study: real `budgettune worker` processes, real PostgreSQL and SQLite.

CPU trials on the tiny GPT with the fast flags (eager, one warm-up, one timed step);
heartbeats every 2 s so a killed worker's trial is failed and re-queued quickly.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psycopg
import pytest
from typer.testing import CliRunner

from budgettune import storage
from budgettune.cli import app
from budgettune.present.dashboard_views import PLOT_ID
from budgettune.storage.coordination import creation_lock
from budgettune.storage.user_attrs import SPEC_ATTR, TARGET_ATTR
from budgettune.study.searcher import Searcher
from budgettune.study.study_file import build_search_spec
from budgettune.study.target import count_trials

State = optuna.trial.TrialState
HEARTBEAT_S = 2
runner = CliRunner()


def _spec(url: str, runs_dir: Path, *, trials: int, study: str = "team"):
    return build_search_spec(
        {
            "workload": "builtin:tiny-gpt",
            "max_mem": "125MB",
            "trials": trials,
            "study": study,
            "storage": url,
            "runs_dir": str(runs_dir),
            "timeout": 300,
            "sampler_seed": 7,
            "space": {"backend": "aot_eager_decomp_partition"},
            # eager trials: these tests are about workers and the study, not the partitioner
            # (a compile costs ~5 s of every CPU trial)
            "fix": {"compile_mode": "eager"},
            "trial": {"warmup_steps": 1, "timed_steps": 1},
        },
        default_device="cpu",
    )


def _create_study(url: str, runs_dir: Path, *, trials: int, study: str = "team") -> None:
    """What `budgettune search` does before its first trial: study, attrs, baselines, target."""
    with creation_lock(url):
        store = storage.open_storage(url, heartbeat_interval_s=HEARTBEAT_S)
    with store:
        searcher = Searcher(_spec(url, runs_dir, trials=trials, study=study), store)
        searcher.claim.close()


def _create_racing(url: str, runs_dir: Path) -> None:
    _create_study(url, runs_dir, trials=4)


def _worker(url: str, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "budgettune.cli", "worker", "--study", "team",
        "--device", "cpu", "--heartbeat-s", str(HEARTBEAT_S), *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "BUDGETTUNE_STORAGE": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trial_child(worker_pid: int) -> tuple[int, str] | None:
    """The running trial process of a worker (its child, or its trial server's):
    (pid, its command line)."""
    import psutil

    try:
        descendants = psutil.Process(worker_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for process in descendants:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "budgettune.trial.child" in command:
            return process.pid, command
    return None


def _frozen_trial_child(worker_pid: int, *, timeout_s: float) -> tuple[int, str] | None:
    """A running trial process of the worker, stopped with SIGSTOP so it cannot finish (its
    parent-death SIGKILL still ends it). None if the worker never ran one in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        child = _trial_child(worker_pid)
        if child is None:
            continue
        try:
            os.kill(child[0], signal.SIGSTOP)
            time.sleep(0.2)
            state = Path(f"/proc/{child[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            continue  # it ended between the look and the stop: wait for the next trial
        if state in ("T", "t"):
            return child
    return None


@pytest.mark.parametrize("backend, num_workers, target", [("postgres", 3, 5), ("sqlite", 2, 4)])
def test_workers_reach_the_target_exactly_and_a_killed_workers_trial_is_rerun(
    backend: str, num_workers: int, target: int, request, tmp_path: Path
) -> None:
    url = (
        request.getfixturevalue("pg_url")
        if backend == "postgres"
        else f"sqlite:///{tmp_path}/bt.db"
    )
    runs = tmp_path / "runs"
    _create_study(url, runs, trials=target)
    workers = [_worker(url, tmp_path) for _ in range(num_workers)]
    try:
        # SIGKILL the first worker while its trial runs. The trial's child is frozen first:
        # an eager tiny-GPT trial can finish within seconds, and a worker killed between
        # trials leaves nothing to re-run (a flake CI saw).
        victim = workers[0]
        child = _frozen_trial_child(victim.pid, timeout_s=120)
        assert child is not None, "the worker never started a trial"
        victim.kill()
        victim.wait()
        killed_run = child[1].split()[-2]  # .../trial-NNNN/SPEC.json
        killed_number = int(Path(killed_run).parent.name.split("-")[1])
        time.sleep(1)
        leftover = subprocess.run(["pgrep", "-f", killed_run], capture_output=True, text=True)
        assert leftover.stdout.strip() == "", "the trial process outlived its worker"
        outputs = [w.communicate(timeout=400) for w in workers[1:]]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    for w, (_, err) in zip(workers[1:], outputs, strict=True):
        assert w.returncode == 0, err
    study = optuna.load_study(study_name="team", storage=url)
    trials = study.get_trials(deepcopy=False)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) == target + 1  # one extra: the re-run copy
    count = count_trials(trials, target=study.user_attrs[TARGET_ATTR])
    assert (count.counted, count.finished, count.waiting, count.running) == (target, target, 0, 0)
    killed = trials[killed_number]
    assert killed.state == State.FAIL and "outcome" not in killed.user_attrs
    # every trial names the worker that ran it, the killed one too (set before its child starts)
    assert {t.user_attrs.get("worker") for t in trials} == {f"{socket.gethostname()}:cpu"}
    copies = [t for t in trials if t.system_attrs.get("retry_history") == [killed_number]]
    # the copy finishes: COMPLETE if its config fits the study's limit, PRUNED if it does not
    assert len(copies) == 1 and copies[0].state in (State.COMPLETE, State.PRUNED)
    assert copies[0].user_attrs.get("outcome") == "ok"
    assert copies[0].user_attrs.get("baseline") == killed.user_attrs.get("baseline")
    # bt_measurements agrees with Optuna: every row names a trial of the study, the killed
    # trial (its child never finished) has none, every finished trial has one.
    with storage.open_storage(url, create=False) as store:
        rows = store.measurements("team", kind="trial")
    measured = sorted(r.trial_number for r in rows if r.trial_number is not None)
    assert set(measured) <= set(numbers) and killed_number not in measured
    assert measured == sorted(t.number for t in trials if t.number != killed_number)
    # the workers refreshed the dashboard views after their trials
    optuna_storage = study._storage
    attrs = optuna_storage.get_study_system_attrs(optuna_storage.get_study_id_from_name("team"))
    assert any(key.startswith(f"dashboard:plot_data:{PLOT_ID}") for key in attrs), sorted(attrs)


def test_two_searches_racing_to_create_one_study_queue_the_baselines_once(
    pg_url: str, tmp_path: Path
) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.starmap(_create_racing, [(pg_url, tmp_path / "runs")] * 4)
    assert optuna.get_all_study_names(pg_url) == ["team"]
    study = optuna.load_study(study_name="team", storage=pg_url)
    assert [t.user_attrs["baseline"] for t in study.trials] == [
        "unconstrained",
        "block-ac-every-1",
        "budget-0.5",
    ]
    assert SPEC_ATTR in study.user_attrs
    # four searches at once, each adding --num-trials 4, all still live (their processes
    # are, and none closed its search): each added its 4 (issue 48: two at once added 3 in all)
    assert study.user_attrs[TARGET_ATTR] == 4 * 4


def _one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_worker_bad_inputs_are_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "bt.db"
    url = f"sqlite:///{db}"
    _create_study(url, tmp_path / "runs", trials=3)
    with storage.open_storage(url) as store:
        optuna.create_study(study_name="older", storage=store.optuna_storage)
    missing = _one_line_error(runner.invoke(app, ["worker", "--study", "nope", "--storage", url]))
    assert "no study 'nope'" in missing and "studies: older, team" in missing
    older = _one_line_error(runner.invoke(app, ["worker", "--study", "older", "--storage", url]))
    assert "holds no search spec" in older
    gpu = runner.invoke(app, ["worker", "--study", "team", "--storage", url, "--device", "cuda:7"])
    assert "no CUDA GPU" in _one_line_error(gpu)
    gpus = runner.invoke(app, ["search", "--max-mem", "1GB", "--gpus", "0,1"])
    assert "--gpus 0,1: no CUDA GPU" in _one_line_error(gpus)
    assert not (tmp_path / "budgettune.db").exists()
    with sqlite3.connect(db) as conn:
        conn.execute("update budgettune_alembic_version set version_num = '9999'")
    ahead = runner.invoke(app, ["worker", "--study", "team", "--storage", url])
    assert "newer budgettune" in _one_line_error(ahead)


def test_worker_stops_with_one_line_when_the_database_goes_away(
    pg_url: str, tmp_path: Path
) -> None:
    _create_study(pg_url, tmp_path / "runs", trials=5)
    name = pg_url.rsplit("/", 1)[1]
    worker = _worker(pg_url, tmp_path)
    admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1)
            study = optuna.load_study(study_name="team", storage=pg_url)
            if any(t.state == State.COMPLETE for t in study.get_trials(deepcopy=False)):
                break
        # the server refuses the database and drops every connection to it (a failover)
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        _, err = worker.communicate(timeout=180)
    finally:
        if worker.poll() is None:
            worker.kill()
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()
    assert worker.returncode == 1, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: storage postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    # the server's own words: the connection it cut mid-query, or the reconnect it refused
    # (which comes first is a race between the worker and the terminate); or libpq's, when the
    # cut lands while it reads and the server's notice is lost with it (seen 2026-11-28)
    words = ("not currently accepting connections", "terminating connection", "server closed")
    assert any(said in last for said in words), err
    # back up: the finished trials are all there
    study = optuna.load_study(study_name="team", storage=pg_url)
    assert any(t.state == State.COMPLETE for t in study.get_trials(deepcopy=False))
