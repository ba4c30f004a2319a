"""The `budgettune` command line. The only module that prints or exits.

Each command parses its flags, builds a spec, makes one call and renders the answer. Every
`BudgettuneError` is caught here once: one line on stderr, exit code by kind (``--debug`` shows
the traceback).

Exit codes (`EXIT_CODES_HELP`): 0 ok; 1 other errors (a trial that did not end ``ok``, a
storage failure, a file system fault); 2 usage (bad flag, file or reference); 3 nothing
measured fits under the limit; 4 no trial could be measured at all; 130 Ctrl-C, 143 SIGTERM.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from budgettune.errors import (
    READ_ERRORS,
    BudgettuneError,
    SpecError,
    UsageError,
    terminal_safe,
)
from budgettune.study.spec import DEFAULT_RUNS_DIR
from budgettune.trial.processes import Terminated, sigterm_raises

EXIT_CODES_HELP = (
    "\n\n\b\nExit codes:\n"  # \b: click keeps these lines as they are
    "  0    ok\n"
    "  1    error (or a trial that did not end ok)\n"
    "  2    bad usage or input\n"
    "  3    no configuration fits under the memory limit (or a pin no longer does)\n"
    "  4    no trial could be measured at all (each crashed, timed out or had a\n"
    "       non-finite loss)\n"
    "  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); finished work is kept"
)

app = typer.Typer(
    name="budgettune",
    help=(
        "Find, by measurement, the activation-recompute configuration of a PyTorch training "
        "step that fits a memory limit with the least slowdown." + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help: full flag names and rewrapped paragraphs at any width (rich's tables
    # cut 14 of search's flag names at 80 columns, and kept the docstrings' line breaks)
    rich_markup_mode=None,
    add_completion=False,
)
STORAGE_ENV = "BUDGETTUNE_STORAGE"
"""The storage every command opens when none is given (a team's PostgreSQL URL, say)."""
STORAGE_OPTION = typer.Option(
    "--storage-url",
    "--storage",
    envvar=STORAGE_ENV,
    help=f"SQLAlchemy URL or SQLite path (default ${STORAGE_ENV}, else ./budgettune.db).",
    show_envvar=False,
)
"""The storage option of every command that opens the store: one spelling (issue 47),
``--storage`` still read."""
STUDY_OPTION = typer.Option("--study-name", "--study", help="Study name (default: the only one).")
"""The study option of the commands that read one study (``--study`` still read)."""


def files_read(storage_url: str | None, *files: str | Path | None) -> list[Path]:
    """What a command reads, which its ``--output`` must never replace: the storage's SQLite
    database and journals (none for a server) and the given files (None: not given)."""
    from budgettune.storage.engine import storage_files

    return [*storage_files(storage_url), *(Path(f) for f in files if f is not None)]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"budgettune {version('budgettune')}")
        raise typer.Exit()


# No markup parsing in printed strings: error messages and configurations contain brackets
# (`pip install 'budgettune[postgres]'`) that rich would swallow as tags.
stdout = Console(soft_wrap=True, markup=False)
stderr = Console(stderr=True, soft_wrap=True, markup=False)


def print_error(text: str) -> None:
    """``error: TEXT`` on stderr, the prefix in bold red, the text as it is but bounded and
    without control characters (`terminal_safe`: it may echo what a user gave)."""
    stderr.print(Text("error: ", style="bold red") + Text(terminal_safe(text)), highlight=False)


_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def _stdout_to_devnull() -> None:
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())


def handles_errors(command: F) -> F:
    """Turn a `BudgettuneError` into one line on stderr and its exit code, and SIGINT or
    SIGTERM into one line and 130 or 143."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_raises():  # SIGTERM unwinds like Ctrl-C: children ended, trial re-queued
                result = command(*args, **kwargs)
                sys.stdout.flush()  # a full or closed stdout fails here, in this handler
                return result
        except OSError as exc:  # its output could not be written (>/dev/full, a closed pipe)
            if _state["debug"]:
                raise
            _stdout_to_devnull()  # the interpreter's last flush must not fail again
            where = f"{exc.filename}: " if exc.filename else ""
            print_error(f"{where}{exc.strerror or exc}")
            raise typer.Exit(1) from None
        except BudgettuneError as exc:
            if _state["debug"]:
                raise
            if isinstance(exc, SpecError):  # a spec read from a damaged row, not the user's
                from budgettune.storage.unreadable import unreadable_data

                exc = unreadable_data(exc) or exc
            print_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except READ_ERRORS as exc:  # one line when stored data could not be read (P6-2)
            from budgettune.storage.unreadable import unreadable_data  # the storage is heavy

            unreadable = unreadable_data(exc)
            if unreadable is None or _state["debug"]:
                raise
            print_error(str(unreadable))
            raise typer.Exit(unreadable.exit_code) from None
        except KeyboardInterrupt as exc:
            stderr.print("interrupted; finished work is kept", highlight=False)
            code = 143 if isinstance(exc, Terminated) else 130
            _exit_past_stray_threads(code)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def _exit_past_stray_threads(code: int) -> None:
    """Exit with ``code`` now when a thread the interrupt left running would hold up the
    interpreter's exit (it waits for every thread that is not a daemon). Optuna's trial
    heartbeat is such a thread, started as a trial starts (`BaseHeartbeatThread.__enter__`):
    a Ctrl-C that lands while it starts leaves it beating with nothing to stop it (a clean-clone
    CI run of the interrupted-search test once waited 120 s past this line). What the search
    kept is in its database already, and its children were ended while the interrupt unwound."""
    import threading

    stray = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if stray:
        logging.getLogger(__name__).debug("leaving past running threads: %s", ", ".join(stray))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


@app.callback()
def _main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else (logging.INFO if verbose else logging.WARNING),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from budgettune.trial import cpu_lock

    # a trial that waits for another's CPU-trial lock says so (one line) without -v
    cpu_lock.logger.setLevel(logging.DEBUG if debug else logging.INFO)


def quiet_background() -> None:
    """Keep a long run's stderr to our own lines: progress, trial lines, one error line.

    Optuna's per-trial log lines (and its tracebacks for failed trials) are shown with
    ``--verbose``/``--debug`` only; an exception in a background thread (Optuna's trial
    heartbeat, when the database goes away) is logged, not printed as a traceback: the main
    loop reports the same failure in one line.
    """
    import threading

    import optuna

    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        optuna.logging.set_verbosity(optuna.logging.ERROR)

    def log_thread_error(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "a thread"
        logging.getLogger("budgettune").info("%s stopped: %r", name, args.exc_value)
        if args.exc_value is not None:
            logging.getLogger("budgettune").debug("traceback", exc_info=args.exc_value)

    threading.excepthook = log_thread_error


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["batch_size=8", "dtype=bf16"]`` → ``{"batch_size": 8, "dtype": "bf16"}``."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option {pair!r}: write it as KEY=VALUE, e.g. batch_size=8")
        value: Any = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        options[key.strip()] = value
    return options


def print_json(data: Any) -> None:
    """The machine-readable document, alone on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_count(flag: str, value: int, *, most: int | None = None) -> None:
    """A count flag (``--runs``) is at least 1 (and at most ``most``).

    Raises:
        UsageError: one line naming the flag.
    """
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")
    if most is not None and value > most:
        raise UsageError(f"{flag} must be at most {most}, got {str(value):.40}")


def default_device(workload: str) -> str:
    """A built-in's own device, else CUDA when NVML sees a GPU, else CPU."""
    from budgettune.trial.devices import cuda_device_count
    from budgettune.workload import builtin_workload

    if workload.startswith("builtin:"):
        return builtin_workload(workload.split(":", 1)[1]).default_device
    return "cuda" if cuda_device_count() > 0 else "cpu"


def default_run_dir(kind: str) -> Path:
    """``./budgettune-runs/<kind>-<timestamp>``: where trial specs, results and logs go."""
    import datetime

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(DEFAULT_RUNS_DIR) / f"{kind}-{stamp}"
