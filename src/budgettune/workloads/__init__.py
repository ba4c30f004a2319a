"""Built-in workloads, each a ``build(device, **options) -> Workload`` builder.

The table of names lives in `budgettune.workload_builtins.BUILTINS` (the parent reads it
without importing torch); these modules import torch at the top and are only imported in the
child.
"""
