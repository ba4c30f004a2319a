"""The study, in the parent process: the space, the ask → launch → tell loop, baselines,
numerics checks, re-verification and the pin, the trial target and the workers.

It launches trials through `budgettune.trial.launcher` and never touches the GPU itself.
"""
