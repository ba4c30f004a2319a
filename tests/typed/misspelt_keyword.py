"""`.ci/run` checks that ``mypy --strict`` reports the misspelt keyword below (issue 47: the
search's keywords are typed, so a typo is caught before anything runs); not run."""

import budgettune

budgettune.search("builtin:tiny-gpt", max_mem="20GB", num_trails=20)
