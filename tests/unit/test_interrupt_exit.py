"""A Ctrl-C ends the command even when a thread that is not a daemon is left running (Optuna's
trial heartbeat, when the interrupt lands while it starts): the interpreter would wait for it
forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import threading, time
    import typer
    from budgettune.cli.app import handles_errors

    app = typer.Typer()

    @app.command()
    @handles_errors
    def beat(stray: bool = False) -> None:
        if stray:  # as Optuna's heartbeat: not a daemon, no one left to stop it
            threading.Thread(target=lambda: time.sleep(3600), name="heartbeat").start()
        raise KeyboardInterrupt

    app()
    """
)


@pytest.mark.parametrize("stray", [False, True])
def test_an_interrupted_command_exits_130_whatever_threads_it_left(stray: bool) -> None:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *(["--stray"] if stray else [])],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["interrupted; finished work is kept"]
    assert time.monotonic() - start < 30  # the stray thread sleeps an hour
