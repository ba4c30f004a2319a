"""A pin in the trainers people use: the training job's side, like `pinning.pinned`.

- `budgettune.integrations.transformers`: `PinCallback` for a `transformers` `Trainer`, and
  `write_workload`, a `Trainer`'s model and first batch as a workload to search;
- `budgettune.integrations.lightning`: `PinCallback` for a Lightning `Trainer`;
- `budgettune.integrations.torchtitan`: a pin as torchtitan's job-config sections
  (``budgettune export --format torchtitan``).

Each module imports its library at the top, so import the one you use; `import budgettune`
imports none of them. Nothing here imports the study's side (search, storage, the CLI,
Optuna, SQLAlchemy).
"""
