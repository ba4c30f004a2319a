"""`budgettune db ...`: schema commands."""

from __future__ import annotations

from typing import Annotated

import typer

from budgettune.cli.app import (
    STORAGE_OPTION,
    app,
    handles_errors,
    stdout,
)

db_app = typer.Typer(help="Database schema commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
@handles_errors
def db_upgrade(
    storage: Annotated[str | None, STORAGE_OPTION] = None,
) -> None:
    """Upgrade the study database (budgettune's and Optuna's tables) to this version; an empty
    or new one gets them, another program's database is refused unchanged (exit 2)."""
    from budgettune import storage as storage_mod

    before, after = storage_mod.upgrade(storage)
    stdout.print(f"budgettune schema: {before or 'empty'} -> {after}")
