"""Trial servers (`budgettune.trial.forkserver`, `budgettune.trial.servers`): a trial forked
from a pre-imported server is measured as a fresh process measures it, skips the imports, and
is timed out, killed and cleaned up like one; the server outlives its trials, not its pool."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from budgettune.trial.launcher import TRIAL_SERVER_ENV, launch_trial, run_env, trial_servers
from budgettune.trial.results import TrialOutcome
from budgettune.trial.servers import LATE_ENV, TrialServers, _key
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "faulty_workloads.py"
FAST = TrialSpec(compile_backend="aot_eager_decomp_partition", warmup_steps=1, timed_steps=2)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialServers]:
    pool = TrialServers(
        preload=("budgettune.workloads.tiny_gpt",),
        log_dir=tmp_path_factory.mktemp("servers"),
        ready_wait_s=300,
    )
    yield pool
    pool.close()


def _run(folder: Path, workload: str, servers: TrialServers | None, *, timeout_s: float = 120.0):
    run = TrialRun(spec=FAST, workload=workload, device="cpu", cache_root=None)
    return launch_trial(run, run_dir=folder, timeout_s=timeout_s, servers=servers)


def _server_of(result) -> int | None:
    found = re.search(r"forked by trial server (\d+)", Path(result.log_path).read_text())
    return None if found is None else int(found.group(1))


def _survivors(pattern: str) -> list[str]:
    deadline = time.monotonic() + 10
    while True:
        found = subprocess.run(
            ["pgrep", "-f", pattern], capture_output=True, text=True, check=False
        ).stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_served_trial_measures_what_a_fresh_process_measures(
    tmp_path: Path, servers: TrialServers
) -> None:
    fresh = _run(tmp_path / "fresh", "builtin:tiny-gpt", None)
    served = _run(tmp_path / "served", "builtin:tiny-gpt", servers)
    again = _run(tmp_path / "again", "builtin:tiny-gpt", servers)
    for result in (fresh, served, again):
        assert result.outcome is TrialOutcome.OK, result.error
    assert _server_of(fresh) is None
    assert _server_of(served) is not None and _server_of(again) == _server_of(served)
    f, s = fresh.measurement, served.measurement
    assert f is not None and s is not None
    # (two fresh runs differ in the last digits too: a parallel reduction's order)
    assert s.loss == pytest.approx(f.loss, rel=1e-9)
    assert s.grad_norm == pytest.approx(f.grad_norm, rel=1e-9)
    assert (s.peak_allocated_bytes, s.steady_bytes) == (f.peak_allocated_bytes, f.steady_bytes)
    assert s.phase_peak_bytes == f.phase_peak_bytes
    assert served.workload_fingerprint == fresh.workload_fingerprint
    # the imports were the server's: the fork starts with torch and its compiler loaded
    assert again.phases_s["imports"] < 0.5 < fresh.phases_s["imports"]
    assert again.phases_s["start"] < 1.0
    assert sum(again.phases_s.values()) == pytest.approx(again.wall_s, abs=0.01)


def test_a_served_trial_that_hangs_is_timed_out_with_its_tree_and_the_server_serves_on(
    tmp_path: Path, servers: TrialServers
) -> None:
    import threading

    spec_path = str(tmp_path / "hang" / "SPEC.json")
    results = []
    started = time.monotonic()
    worker = threading.Thread(
        target=lambda: results.append(_run(tmp_path / "hang", f"{FIXTURES}:hangs", servers,
                                           timeout_s=5))
    )  # fmt: skip
    worker.start()
    seen = []  # the fork carries the trial child's command line, as `ps` and `pgrep` show
    while worker.is_alive() and not seen:
        seen = subprocess.run(
            ["pgrep", "-f", f"budgettune.trial.child {spec_path}"], capture_output=True, text=True
        ).stdout.split()
        time.sleep(0.2)
    worker.join()
    [result] = results
    assert seen, "no process showed the trial child's command line"
    assert result.outcome is TrialOutcome.TIMEOUT
    assert time.monotonic() - started < 60
    assert _server_of(result) is not None
    assert _survivors(spec_path) == []
    after = _run(tmp_path / "after", f"{FIXTURES}:raises", servers)
    assert after.outcome is TrialOutcome.CRASHED and "bad hidden size" in after.error
    assert _server_of(after) == _server_of(result)


@pytest.mark.parametrize("fn", ["segfaults", "exits"])
def test_a_served_trial_that_dies_is_crashed(
    tmp_path: Path, servers: TrialServers, fn: str
) -> None:
    result = _run(tmp_path / fn, f"{FIXTURES}:{fn}", servers)
    assert result.outcome is TrialOutcome.CRASHED, result.error
    assert "without writing a result" in result.error
    if fn == "segfaults":
        assert "SIGSEGV" in result.error
    assert _server_of(result) is not None


def test_what_a_served_trial_left_behind_is_ended(tmp_path: Path, servers: TrialServers) -> None:
    marker = f"budgettune-helper-{tmp_path.name}"
    run = TrialRun(
        spec=FAST,
        workload=f"{FIXTURES}:leaves_a_helper",
        workload_options={"marker": marker},
        device="cpu",
        cache_root=None,
    )
    result = launch_trial(run, run_dir=tmp_path / "trial", timeout_s=120, servers=servers)
    assert result.outcome is TrialOutcome.OK, result.error
    assert _server_of(result) is not None
    assert _survivors(marker) == []


def test_servers_are_keyed_by_what_torch_reads_at_import() -> None:
    # a trial in another environment gets its own server (the pool keeps one per key); the
    # variables torch reads only later (allocator, cache folders) do not split them
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    late = {name: f"/somewhere/{name}" for name in LATE_ENV}
    assert _key({**base, **late}) == _key(base)
    assert _key({**base, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}) != _key(base)
    assert _key({**base, "OMP_NUM_THREADS": "3"}) != _key(base)  # read when torch is imported


def test_a_closed_pool_leaves_no_server_and_a_disabled_one_spawns(tmp_path: Path) -> None:
    # a search's pool waits for no server: the first trial starts as a new process while the
    # server imports, and a later trial is forked from it
    pool = TrialServers()
    first = _run(tmp_path / "first", f"{FIXTURES}:raises", pool)
    assert _server_of(first) is None and "bad hidden size" in first.error
    pool.ready_wait_s = 300  # now the next trial waits for the server it started
    served = _run(tmp_path / "a", f"{FIXTURES}:raises", pool)
    pid = _server_of(served)
    assert pid is not None
    pool.disable("told to")
    spawned = _run(tmp_path / "b", f"{FIXTURES}:raises", pool)
    assert _server_of(spawned) is None and "bad hidden size" in spawned.error
    pool.close()
    assert not Path(f"/proc/{pid}").exists()


def test_no_servers_when_switched_off_or_sharded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = TrialRun(spec=FAST, workload="builtin:tiny-gpt", device="cpu")
    pool = trial_servers(run, tmp_path)
    assert pool is not None
    pool.close()
    sharded = TrialRun(spec=FAST, workload="builtin:tiny-gpt", device="cpu", nproc_per_node=2)
    assert trial_servers(sharded, tmp_path) is None
    monkeypatch.setenv(TRIAL_SERVER_ENV, "0")
    assert trial_servers(run, tmp_path) is None


def test_prestarted_servers_serve_the_first_trials_of_a_pool_that_waits_for_none(
    tmp_path: Path,
) -> None:
    # issue 44: a search's pool waits for no server, so its first trial of an environment
    # starts as a new process (6-7 s of imports on a GPU host); servers started ahead
    # (`Searcher.prestart_servers`, while the workers' trials run) serve the first ones
    pool = TrialServers(log_dir=tmp_path / "servers")
    run = TrialRun(spec=FAST, workload=f"{FIXTURES}:raises", device="cpu", cache_root=None)
    env = run_env(run)
    try:
        pool.prestart([env, env])  # two slots of one environment: a server each
        entries = pool._idle[_key(env)]
        assert len(entries) == 2
        for entry in entries:  # as the workers' trials would take: seconds of imports
            server = entry.result(timeout=120) if isinstance(entry, Future) else entry
            assert server.poll_ready(120)
        pids = {s.process.pid for s in pool._all}
        assert len(pids) == 2
        served = launch_trial(run, run_dir=tmp_path / "a", timeout_s=120, servers=pool)
        assert _server_of(served) in pids
        assert "bad hidden size" in served.error
    finally:
        pool.close()
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
