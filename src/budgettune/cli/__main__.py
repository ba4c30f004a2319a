"""``python -m budgettune.cli``: the command line (workers are started this way)."""

from budgettune.cli import main

main()
