"""Issue 29: the host's CPU-trial lock follows no link, changes no file, and is waited for no
longer than the trial's timeout. Real lock files in tmp_path, real flocks (one open file
description per `cpu_trial_lock` call, so one process can hold it against itself)."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from pathlib import Path

import pytest

from budgettune.errors import UsageError
from budgettune.trial.cpu_lock import CPU_LOCK_ENV, CpuLockTimeout, cpu_trial_lock
from budgettune.trial.launcher import launch_trial
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


@pytest.fixture
def lock_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cpu.lock"
    monkeypatch.setenv(CPU_LOCK_ENV, str(path))
    return path


def _personal(lock_path: Path) -> Path:
    return lock_path.with_name(f"cpu-{os.getuid()}.lock")


def test_a_symlinked_lock_is_not_followed_and_its_target_keeps_its_mode(
    lock_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("mine\n")
    secret.chmod(0o600)
    lock_path.symlink_to(secret)
    with caplog.at_level(logging.INFO), cpu_trial_lock() as held:
        assert held.path == _personal(lock_path)  # the user's own lock, a plain file
        assert stat.S_ISREG(os.lstat(held.path).st_mode)
        with secret.open("rb") as other:  # the link's target is not what is locked
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == "mine\n"
    assert lock_path.is_symlink()
    assert "is a symbolic link (not followed)" in caplog.text


def test_a_fifo_under_the_lock_name_neither_blocks_nor_is_used(lock_path: Path) -> None:
    os.mkfifo(lock_path)
    started = time.monotonic()
    with cpu_trial_lock(timeout_s=5) as held:
        assert held.path == _personal(lock_path)
    assert time.monotonic() - started < 2


def test_a_personal_lock_that_is_a_link_too_is_refused(lock_path: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    lock_path.symlink_to(target)
    _personal(lock_path).symlink_to(target)
    with pytest.raises(UsageError, match=rf"symbolic link .*set {CPU_LOCK_ENV}"):
        cpu_trial_lock()


def test_the_lock_is_made_with_the_umask_and_an_existing_one_is_left_as_it_is(
    lock_path: Path,
) -> None:
    previous = os.umask(0o027)
    try:
        with cpu_trial_lock() as held:
            assert held.path == lock_path
    finally:
        os.umask(previous)
    assert stat.S_IMODE(lock_path.stat().st_mode) == 0o640
    lock_path.chmod(0o444)  # someone else's read-only lock: flock needs no write access
    with cpu_trial_lock() as held:
        assert held.path == lock_path
    assert stat.S_IMODE(lock_path.stat().st_mode) == 0o444


def test_the_wait_is_bounded_and_names_the_lock_and_its_holder(
    lock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with cpu_trial_lock(), caplog.at_level(logging.INFO):
        started = time.monotonic()
        with pytest.raises(CpuLockTimeout) as caught:
            cpu_trial_lock(timeout_s=0.5)
        waited = time.monotonic() - started
    assert 0.5 <= waited < 3, waited
    message = str(caught.value)
    assert str(lock_path) in message and f"held by pid {os.getpid()} (" in message
    assert [r.getMessage() for r in caplog.records if "waiting up to 0.5 s" in r.getMessage()]
    with cpu_trial_lock(timeout_s=0.5) as held:  # free again: taken at once
        assert held.waited_s == 0.0


def test_a_cpu_trial_that_cannot_get_the_lock_in_time_ends_as_timeout(
    lock_path: Path, tmp_path: Path
) -> None:
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu")
    with cpu_trial_lock():
        started = time.monotonic()
        result = launch_trial(run, run_dir=tmp_path / "run", timeout_s=1)
    assert time.monotonic() - started < 3
    assert result.outcome is TrialOutcome.TIMEOUT
    assert str(lock_path) in result.error and f"pid {os.getpid()}" in result.error
    assert "not started: waited 1 s for the CPU-trial lock" in Path(result.log_path).read_text()
    assert not (tmp_path / "run" / "RESULT.json").exists()


def test_a_lock_whose_folder_cannot_be_made_is_one_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(CPU_LOCK_ENV, str(tmp_path / "file" / "cpu.lock"))
    with pytest.raises(UsageError, match=rf"cannot make its folder .*set {CPU_LOCK_ENV}"):
        cpu_trial_lock()
