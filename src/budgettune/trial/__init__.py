"""The child side of a trial, and its contract with the parent.

Everything here may run in the trial's own process: `spec` (what to measure) and `results`
(what was measured) are the JSON contract, `launcher` is the parent's side of one trial,
`worker` the child's entry point, `measure` the recipe and `recompute` applies a spec to torch.
Nothing here touches the database, Optuna or the CLI (import-linter holds that); importing this
package does not import torch.
"""
