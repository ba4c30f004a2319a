"""`budgettune dashboard`: optuna-dashboard over the study storage."""

from __future__ import annotations

from typing import Annotated

import typer

from budgettune.cli.app import (
    STORAGE_OPTION,
    app,
    handles_errors,
    stderr,
    stdout,
)


@app.command()
@handles_errors
def dashboard(
    storage: Annotated[str | None, STORAGE_OPTION] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")] = 8080,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes",
            help="Let the page change the store (delete studies, tell trials, edit notes and "
            "attrs, upgrade the schema). Without it the dashboard is read-only: every such "
            "request is refused with 403.",
        ),
    ] = False,
) -> None:
    """Serve optuna-dashboard on the study storage, read-only unless --allow-writes.

    Put it behind a reverse proxy (nginx) to share it; it listens on 127.0.0.1 by default.
    """
    from budgettune.present.dashboard import serve

    if host not in ("127.0.0.1", "localhost", "::1"):
        stderr.print(
            f"warning: the dashboard has no login; on {host} anyone who reaches this host and "
            "port reads every study"
            + (" and can change them (--allow-writes)" if allow_writes else "")
            + "; put it behind a reverse proxy with authentication to share it",
            highlight=False,
        )
    serve(
        storage,
        host=host,
        port=port,
        allow_writes=allow_writes,
        log=lambda line: stdout.print(line, highlight=False, markup=False),
    )
