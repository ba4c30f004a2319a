"""``python -m budgettune``: the command line, without relying on a script on PATH."""

from budgettune.cli import main

main()
