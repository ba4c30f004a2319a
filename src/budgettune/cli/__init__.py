"""The `budgettune` command line: the only package that prints or exits.

`app` holds the Typer app, the consoles and the one error handler; each other module is one
command group (`trial`, `search`, `study`, `serve`, `db`) whose commands parse their flags,
make one call and render the answer; `progress` is the search's progress display.
"""

# isort: skip_file
# Importing a command module registers its commands; this order is the order of `--help`.
from budgettune.cli.app import app, parse_options
from budgettune.cli import trial, search, serve, study, db  # noqa: F401

__all__ = ["app", "main", "parse_options"]


def main() -> None:
    """Console-script entry point."""
    app()
