"""What the benchmark scripts share: reading their records and studies, running one as a
script, and the cells their tables have in common."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn


def read_records(paths: list[Path]) -> list[dict[str, Any]]:
    """All records of the files, in file then line order."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                record["_file"] = path.name
                records.append(record)
    return records


def options_cell(options: dict[str, Any]) -> str:
    """A record's workload options as a table cell: ``k=v, ...``, or ``defaults``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items())) or "defaults"


def pct(value: float | None) -> str:
    """A fraction as a signed percentage, '-' for None."""
    return "-" if value is None else f"{value * 100:+.1f}%"


def judged(cell: str, met: bool | None) -> str:
    """A target's table cell with whether it was met, when known (``<= -12%: met``)."""
    return cell if met is None else f"{cell}: {'met' if met else 'missed'}"


def target_cell(max_slowdown: float | None, met: bool | None = None) -> str:
    """A slowdown target as a table cell (``<= -12%``), with whether it was met when known."""
    if max_slowdown is None:
        return "-"
    return judged(f"<= {max_slowdown * 100:+.0f}%", met)


@contextlib.contextmanager
def kept_storage(url: str) -> Iterator[Any]:
    """Open a kept study database to read it, whatever budgettune revision wrote it.

    A committed SQLite file written at an older revision is upgraded in a temporary copy, so
    reading the results never changes them; any other storage opens as it is.

    Raises:
        StorageError: no storage there (a missing SQLite file is not created), unreachable, or
            of a revision this budgettune cannot read.
    """
    import shutil
    import tempfile

    from budgettune import storage
    from budgettune.storage.engine import normalize_url, sqlite_file

    path = sqlite_file(normalize_url(url))
    current = path is None or not path.is_file()
    if current or storage.current_revision(url) == storage.HEAD_REVISION:
        with storage.open_storage(url, create=False) as store:
            yield store
        return
    with tempfile.TemporaryDirectory(prefix="budgettune-kept-") as folder:
        copy = Path(folder) / path.name
        shutil.copyfile(path, copy)
        storage.upgrade(str(copy))
        with storage.open_storage(str(copy), create=False) as store:
            yield store


def study_trials(url: str, names: list[str] | None = None) -> dict[str, list[Any]]:
    """``{study: trials}`` of a budgettune storage (all studies, or ``names``), read-only.

    Raises:
        StorageError: no storage there (a missing SQLite file is not created), unreachable, or
            a study of ``names`` that it does not hold (the message lists those it does).
    """
    # here, not at the top: report.py renders tables from files and needs no database stack
    from budgettune.errors import StorageError
    from budgettune.storage.coordination import database_errors

    with kept_storage(url) as store, database_errors(store.url):
        held = [s.study_name for s in store.optuna_storage.get_all_studies()]  # made first, first
        missing = [name for name in names or [] if name not in held]
        if missing:
            raise StorageError(
                f"no study {missing[0]!r} in {store.display_url}; studies: {', '.join(held)}"
            )
        return {
            name: store.optuna_storage.get_all_trials(
                store.optuna_storage.get_study_id_from_name(name), deepcopy=False
            )
            for name in names or held
        }


def script_main(main: Callable[[], int]) -> NoReturn:
    """Run a benchmark script: a failure the user can fix (a missing or corrupt file, a storage
    or study that is not there) is one ``error:`` line and exit code 1, not a traceback."""
    from budgettune.errors import BudgettuneError

    try:
        code = main()
    except (BudgettuneError, OSError, json.JSONDecodeError) as exc:
        sys.exit(f"error: {exc}")
    sys.exit(code)
