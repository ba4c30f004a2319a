"""Shared pytest configuration."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

PG_SERVER = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=5"


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it, whatever started the suite. Tests interrupt searches and
    the dashboard with SIGINT and raise it in this process; a runner that starts pytest with
    SIGINT ignored (a background job of a non-interactive shell, `(pytest &)`) passes that on to
    every child, and those tests failed for that reason alone (seen here on 2026-11-25: the
    interrupted search ran to its end, the dashboard had to be killed). An ignored disposition
    is inherited across exec, a handler is not: restoring Python's default here fixes both."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _one_cpu_lock_per_test_worker()


def _one_cpu_lock_per_test_worker() -> None:
    """The suite runs in two pytest-xdist workers (pyproject's addopts): each gets its own
    CPU-trial lock, so the trials of one worker take turns as on a host and the two workers'
    trials run side by side. The lock exists for timing quality (two trials side by side time
    each other); the tests assert memory figures, outcomes and study state, not step times,
    and a test about the lock itself sets its own path."""
    import os
    import tempfile

    from budgettune.trial.cpu_lock import CPU_LOCK_ENV

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and CPU_LOCK_ENV not in os.environ:
        os.environ[CPU_LOCK_ENV] = os.path.join(
            tempfile.gettempdir(), f"budgettune-cpu-tests-{os.getuid()}-{worker}.lock"
        )
    if worker:
        # One intra-op thread per worker and per trial it starts: two workers' trials side by
        # side on two cores, each with torch's default of one thread per core, spun and
        # doubled the CPU time (22 min for the suite); a tiny model gains little from a
        # second thread (a CPU tiny-GPT trial: 14.6 s with one, 12.1 s with two, alone).
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty database on the real PostgreSQL server at 127.0.0.1:5432, dropped after."""
    import psycopg

    name = f"bt_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- gpu marker
# `gpu` tests are deselected unless `--gpu` is given; with `--gpu` and no CUDA they fail
# (never skip), so a GPU run cannot pass silently on a machine without one.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu", action="store_true", help="run the tests marked gpu (need CUDA)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu"):
        return
    selected = [item for item in items if item.get_closest_marker("gpu") is None]
    deselected = [item for item in items if item.get_closest_marker("gpu") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.fail("this test is marked gpu and needs CUDA, but torch sees no CUDA device")


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a study database with budgettune's tables, made once per test worker
    (migrations take ~0.3 s)."""
    from budgettune import storage

    db = tmp_path_factory.mktemp("db") / "bt.db"
    storage.open_storage(str(db)).close()
    return db.read_bytes()


@pytest.fixture
def cli_workdir(tmp_path, monkeypatch: pytest.MonkeyPatch, empty_db: bytes):  # noqa: ANN001, ANN201
    """A working folder holding a real, empty study database ``bt.db``, with the CLI's click
    command built once (typer rebuilds it on every `CliRunner.invoke`, ~0.1 s)."""
    import typer
    import typer.testing

    from budgettune.cli import app

    command = typer.main.get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: command)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bt.db").write_bytes(empty_db)
    return tmp_path
