"""Compiled code is never reused across different partitions (DESIGN.md §4).

AOTAutograd's cache key includes the budget but cannot see a patched op list (measured on torch
2.13), so a cache shared by two op-list variants would serve the first one's partition to the
second. Each (solver, estimator, op-list) variant therefore gets its own cache directory. This
test runs the real inductor compile twice with one cache root: if the second trial were served
the first one's partition, its peak would be the first one's.
"""

from __future__ import annotations

from pathlib import Path

from budgettune.trial.launcher import launch_trial
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

ADDED = ("aten.mm", "aten.addmm", "aten._scaled_dot_product_flash_attention_for_cpu")


def test_op_list_variant_is_not_served_a_stale_partition(tmp_path: Path) -> None:
    root = str(tmp_path / "cache")
    base = TrialSpec(compile_backend="inductor", warmup_steps=1, timed_steps=1)
    plain, recompute_mm = base, base.replace(recompute_ops_added=ADDED)
    peaks = []
    for index, spec in enumerate((plain, recompute_mm)):
        run = TrialRun(
            spec=spec,
            workload="builtin:tiny-gpt",
            workload_options={"n_layers": 1},  # inductor's compile is most of the test
            cache_root=root,
        )
        result = launch_trial(run, run_dir=tmp_path / f"t{index}", timeout_s=600)
        assert result.outcome is TrialOutcome.OK, result.error
        assert result.measurement is not None
        peaks.append(result.measurement.peak_allocated_bytes)
    # two variants, two cache directories, both written
    variants = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert variants == sorted({plain.partition_variant(), recompute_mm.partition_variant()})
    # recomputing the matmuls and attention saves less: a stale partition would not
    assert peaks[1] < 0.9 * peaks[0], peaks
