"""The one error hierarchy. Every user-facing failure is a `BudgettuneError`.

`budgettune.cli` catches these once, prints ``str(error)`` on one line to stderr and exits with
``error.exit_code``. Messages say what went wrong *and* what to run next.
"""

from __future__ import annotations

import reprlib


def shown_path(path: str) -> str:
    """A path as one printable line (its newlines and control characters as escapes)."""
    return terminal_safe(path, 200).replace("\n", "\\n")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist = 3, 60, 60, 6


def shown_value(value: object) -> str:
    """``value`` as an error line shows it: at most 80 characters, however deep it nests (a
    list 3,000 deep raised `RecursionError` while its line was built: issue 48's P9-6)."""
    return _REPR.repr(value)[:80]


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped ("" when there is none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


MAX_ERROR_CHARS = 1000
"""Longest error line printed: a hostile input echoed in a message (a 100 kB option value, a
study name) is cut in the middle, so the line still says what was wrong and where."""
_CONTROL = {
    c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)
}


def terminal_safe(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as a terminal may print it: control characters but newline and tab written as
    escapes (an ANSI sequence in a study name cannot repaint the terminal), and at most
    ``limit`` characters, the middle left out with a note of how much."""
    text = text.translate(_CONTROL)
    # a lone surrogate (from a JSON escape) cannot be printed: written as its escape
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return cut_middle(text, limit)


def cut_middle(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its start and end with a note
    of how many characters between them were left out."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 4
    return f"{text[:head]} [... {len(text) - head - tail} characters left out ...] {text[-tail:]}"


def one_line(exc: BaseException, *, with_type: bool = False) -> str:
    """An exception as one line: the first non-blank line of its message.

    Args:
        exc: the exception.
        with_type: prefix the exception's class name (``ValueError: bad``), for an error from
            code the user did not write to us (their build, torch) where the name says a lot.

    Returns:
        The line; the class name alone when the message is empty.
    """
    name = type(exc).__name__
    first = first_line(str(exc))
    if not first:
        return name
    return f"{name}: {first}" if with_type else first


class BudgettuneError(Exception):
    """Base of every failure budgettune reports to a user (exit code 1). Its message is at
    most 4 `MAX_ERROR_CHARS` long, the middle left out (issue 48: a 5 MB workload reference in
    a pin made a 5 MB exception for the Python API's caller)."""

    exit_code: int = 1

    def __str__(self) -> str:
        return cut_middle(super().__str__(), 4 * MAX_ERROR_CHARS)


class UsageError(BudgettuneError):
    """Bad input from the user: a flag, a file, a reference (exit code 2)."""

    exit_code = 2


class SpecError(UsageError, ValueError):
    """A configuration value is out of range or unknown (raised from ``__post_init__``)."""


class WorkloadError(UsageError):
    """A workload reference does not resolve, or its builder raised."""


class DeviceUnavailableError(UsageError):
    """The requested device (e.g. ``cuda``) is not present on this machine."""


class StudyFileError(UsageError):
    """A study TOML file is missing, unparsable or holds an unknown key."""


class PinnedConfigError(UsageError):
    """A pinned-config JSON is corrupt or of an unsupported schema version."""


class WorkloadMismatchError(PinnedConfigError):
    """`budgettune verify`: the workload a pin names is not the one it was measured on (its
    fingerprint differs, or the pin records none), so its figures say nothing about it."""


class StudyNotFoundError(UsageError):
    """The named study does not exist in the storage."""


class ForeignDatabaseError(UsageError):
    """The storage is a database of something else: it holds tables, none of them Optuna's or
    ours, so budgettune adds nothing to it (exit code 2)."""


class StorageError(BudgettuneError):
    """The study storage cannot be reached or used."""


READ_ERRORS = (
    ValueError, TypeError, LookupError, RecursionError, OverflowError, AttributeError,
    AssertionError,
)  # fmt: skip
"""What decoding a damaged stored row raises (`json.JSONDecodeError` is a `ValueError`, a state
SQLAlchemy's enum does not know a `LookupError`, a value Optuna asserts on an `AssertionError`):
`budgettune.storage.unreadable` tells it in one line."""


class SchemaBehindError(StorageError):
    """The database schema is older than this budgettune; `budgettune db upgrade` fixes it."""


class SchemaAheadError(StorageError):
    """The database was written by a newer budgettune than this one."""


class WorkerFailedError(BudgettuneError):
    """Worker processes of a ``--gpus`` search exited before the study's target was met."""


class WorkloadFailedError(BudgettuneError):
    """A trial could not import, build or validate the workload: no knob can help, so the
    search stops after that first trial (exit code 1)."""


class TrialInfrastructureError(BudgettuneError):
    """A trial could not use its run folder, compile cache or disk (not a fault of its
    configuration): the search excludes nothing, stops, and the next one re-runs the trial
    (exit code 1)."""


class NonFiniteLossError(BudgettuneError):
    """In the trial child: the first step's loss or gradient norm is NaN or infinite. The
    child turns it into the ``non_finite`` outcome; it never reaches the command line."""


class SharedGpuError(BudgettuneError):
    """In the trial child: its GPU is shared with other trials (``--trials-per-gpu``) and its
    own device memory cannot be told from theirs here; the trial crashes with this line."""


class NoFeasibleConfigError(BudgettuneError):
    """No measured configuration fits under the memory limit (exit code 3)."""

    exit_code = 3


class NothingMeasuredError(BudgettuneError):
    """No trial of the study could be measured at all: every one crashed, timed out or had a
    non-finite loss, so the limit was never tested (exit code 4)."""

    exit_code = 4


class PinNoLongerFitsError(BudgettuneError):
    """`budgettune verify`: the re-measured pin is over its limit (exit code 3)."""

    exit_code = 3
