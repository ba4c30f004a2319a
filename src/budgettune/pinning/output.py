"""Where a pin is written: `check_pin_output` refuses, before the work that makes the pin, a
path that cannot or must not be written (issue 48), and `write_pin` writes it atomically."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from budgettune.errors import BudgettuneError, UsageError, terminal_safe
from budgettune.pinning.document import SCHEMA_VERSION, PinDocument
from budgettune.pinning.pin_schema import PinFields
from budgettune.schema import first_problem
from budgettune.trial.results import write_json_atomically

PIN_SIZE_LIMIT = 16 * 2**20
"""A file larger than this is not a pin budgettune wrote (a pin is a few kB)."""


def read_pin_bytes(path: object) -> bytes:
    """The bytes of the pin file at ``path``: a regular file of at most `PIN_SIZE_LIMIT`
    (issue 48: ``verify /dev/zero`` grew to 22 GB, a FIFO blocked forever).

    Raises:
        FileNotFoundError: no such file.
        OSError: unreadable, or not a regular file, or too large (the message says which).
        TypeError: ``path`` is not a path.
    """
    import stat

    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"a pin's path is a str or a Path, not {type(path).__name__}")
    if not str(path):
        raise OSError("an empty path names no file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):  # before fdopen: a folder's error named the fd
        os.close(fd)
        raise OSError(
            "a folder, not a file" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        )
    with os.fdopen(fd, "rb") as handle:
        if status.st_size > PIN_SIZE_LIMIT:
            raise OSError(f"larger than {PIN_SIZE_LIMIT >> 20} MiB: no pin budgettune wrote")
        data = handle.read(PIN_SIZE_LIMIT + 1)
    if len(data) > PIN_SIZE_LIMIT:
        raise OSError(f"larger than {PIN_SIZE_LIMIT >> 20} MiB: no pin budgettune wrote")
    return data


def is_written_pin(path: Path) -> bool:
    """Whether ``path`` holds a pinned config budgettune wrote (one its pin schema reads: not
    any JSON object with a schema version and a spec, issue 48's P6-4): one that ``--output``
    may replace without ``--force``."""
    try:
        data = json.loads(read_pin_bytes(path))
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(data, dict)
        and data.get("schema_version") == SCHEMA_VERSION
        and isinstance(data.get("spec"), dict)
        and first_problem(PinFields, data) is None
    )


STDOUT = "-"
"""The ``--output`` that means standard output (the pin alone on it), as Unix tools read it."""


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file, followed through links, existing or not yet (or
    two hard links of one file: issue 48's P6-3)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):  # a link loop
        return False


def check_pin_output(
    path: str | Path,
    *,
    what: str = "--output",
    force: bool = False,
    protected: Sequence[str | Path] = (),
) -> None:
    """Refuse a pin path that cannot or must not be written, before the work that makes the
    pin (issue 48: ``--output budgettune.db`` replaced the study's database with the pin).

    Never written: a folder, a special file (a FIFO, a device: written beside and renamed, the
    pin would replace ``/dev/null`` itself), any of ``protected`` (the storage's database and
    its journals, the study file, the pin being read). Replaced only with ``force``: an
    existing file that is not a pin budgettune wrote, or a symbolic link (the rename replaces
    the link, not its target).

    ``-`` is standard output (`STDOUT`): nothing to check.

    Raises:
        UsageError: naming the path and what to do instead.
    """
    import stat

    if str(path) == STDOUT:
        return
    if isinstance(path, str) and path.endswith(("/", os.sep)):  # Path() would drop the slash
        raise UsageError(
            f"{what} {terminal_safe(path, 200)} names a folder: give the pin's file, e.g. "
            f"{terminal_safe(path, 200)}budgettune-pin.json"
        )
    target = Path(path)
    try:
        status = target.lstat()
    except (FileNotFoundError, NotADirectoryError):
        status = None  # (under a file: refused below, as not a folder)
    except OSError as exc:
        raise UsageError(f"{what} {target}: {exc.strerror or exc}") from None
    for other in protected:
        # whether or not either exists yet: a new study's database is made after this check
        # (issue 48: --output new.db with --storage-url new.db replaced the study with the pin)
        other_path = Path(other)
        if same_file(target, other_path):
            raise UsageError(
                f"{what} {target} is {other_path.name}, which this command reads or writes "
                "(the study's database or its journals, the study file, the pin): name another "
                "file"
            )
    if status is not None:
        if stat.S_ISDIR(status.st_mode) or target.is_dir():
            raise UsageError(
                f"{what} {target} is a folder; name the pin's file, e.g. "
                f"{target / 'budgettune-pin.json'}"
            )
        if stat.S_ISLNK(status.st_mode):
            if not force:
                raise UsageError(
                    f"{what} {target} is a symbolic link; the pin would replace the link "
                    "itself: name the file it points to, or pass --force"
                )
        elif not stat.S_ISREG(status.st_mode):
            raise UsageError(f"{what} {target} is not a regular file: name a file to write")
        elif not force and not is_written_pin(target):
            raise UsageError(
                f"{what} {target} exists and is not a pinned config budgettune wrote; "
                "name another file, or pass --force to replace it"
            )
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # write_pin makes the missing folders
    if not folder.is_dir():
        raise UsageError(f"{what} {target}: {folder} is not a folder")
    try:  # a file made and removed there: the pin is written beside and renamed, and a
        # folder may refuse that whatever its mode says (/proc/self/fd as root: issue 48's
        # P9-11, found only when the pin was written)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".budgettune-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError:
        raise UsageError(f"{what} {target}: cannot write into {folder}") from None


def write_pin(path: str | Path, pin: PinDocument | Mapping[str, Any]) -> Path:
    """Write the pinned JSON atomically (a document read elsewhere is written as it was read);
    returns the path written. ``-`` (`STDOUT`) prints it on standard output instead, as the
    file would hold it.

    Raises:
        BudgettuneError: the file cannot be written (one line, with the reason).
    """
    data = pin.to_json_dict() if isinstance(pin, PinDocument) else pin
    if str(path) == STDOUT:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return Path(STDOUT)
    target = Path(path)
    try:
        write_json_atomically(target, data)
    except OSError as exc:
        raise BudgettuneError(
            f"cannot write the pinned config {target}: {exc.strerror or exc}"
        ) from None
    return target
