"""Deprecated name of the trial child: ``python -m budgettune.trial_worker SPEC.json RESULT.json``.

Kept for one release; the entry point is now ``python -m budgettune.trial.child``.
"""

import sys

from budgettune.trial.child import main

if __name__ == "__main__":
    sys.exit(main())
