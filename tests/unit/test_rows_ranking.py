"""Issue 46: a search over micro-batches without a global batch ranks samples per second.
Every trial steps on its own rows; its step time is scaled to the given micro-batch's rows
(`TrialSpec.ranked_ms`, `SearchSpec.ranking_rows`) wherever the search compares two of them:
Optuna's value, the candidates, the re-measured medians, the opening's points and the pin's
slowdown against a reference. With a global batch, or one micro-batch, nothing changes."""

from __future__ import annotations

import pytest
from storage_samples import run_result

from budgettune.pinning import Candidate, ReferenceTrial
from budgettune.pinning.choose import qualified, reference_figures
from budgettune.study.space import SearchSpace
from budgettune.study.spec import SearchSpec
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialSpec

ONE_ROW = TrialSpec(micro_batch=1)
FOUR_ROWS = TrialSpec(micro_batch=4)


def _result(ms: float) -> TrialResult:
    return run_result(10, ms)


def _search(sizes: list[int], global_batch: int = 0, batch_size: int | None = None) -> SearchSpec:
    options = {} if batch_size is None else {"batch_size": batch_size}
    return SearchSpec(
        workload="builtin:tiny-gpt",
        device="cpu",
        max_mem_bytes=10**9,
        study_name="s",
        space=SearchSpace.for_device("cpu").replace(lists={"micro_batches": tuple(sizes)}),
        global_batch=global_batch,
        workload_options=options,
    )


def test_a_step_time_is_scaled_to_the_rows_only_where_the_spec_says_its_own() -> None:
    assert FOUR_ROWS.ranked_ms(40.0, 8) == pytest.approx(80.0)  # 10 ms a row, 8 rows
    assert ONE_ROW.ranked_ms(15.0, 8) == pytest.approx(120.0)
    assert FOUR_ROWS.ranked_ms(40.0, 0) == 40.0  # every trial of the same rows
    assert TrialSpec().ranked_ms(40.0, 8) == 40.0  # the workload's own batch: rows unknown
    accumulated = TrialSpec(micro_batch=2, accum_steps=4)
    assert accumulated.ranked_ms(40.0, 8) == pytest.approx(40.0)  # 8 rows a step already


def test_only_several_micro_batches_without_a_global_batch_rank_by_rows() -> None:
    assert _search([2, 4, 8]).ranking_rows == 8  # the largest, the workload's own unknown
    assert _search([2, 4, 8], batch_size=4).ranking_rows == 4  # the workload's own
    assert _search([2, 4, 8], global_batch=16).ranking_rows == 0  # one optimizer step
    assert _search([4]).ranking_rows == 0
    assert _search([0]).ranking_rows == 0
    # and the search is no longer refused: each size steps on its own rows
    assert _search([2, 4, 8]).space.micro_batches == (2, 4, 8)


def test_the_re_measured_medians_rank_by_samples_per_second() -> None:
    # one row in 15 ms (66.7 samples/s) against four rows in 40 ms (100 samples/s): by step
    # time the one-row candidate leads, by samples per second the four-row one
    one = Candidate(trial_number=1, spec=ONE_ROW, step_time_ms=15.0, peak_bytes=10)
    four = Candidate(trial_number=2, spec=FOUR_ROWS, step_time_ms=40.0, peak_bytes=10)
    runs = {1: [_result(15.0)], 2: [_result(40.0)]}
    common = dict(limit_bytes=100, mem_metric="device", margin=0.0)
    by_step = qualified([one, four], runs, **common)
    by_rows = qualified([one, four], runs, **common, rows=4)
    assert [c.trial_number for _, c, _ in by_step] == [1, 2]
    assert [c.trial_number for _, c, _ in by_rows] == [2, 1]
    assert [ms for ms, _, _ in by_rows] == pytest.approx([40.0, 60.0])


def test_the_pin_states_its_slowdown_per_row_against_a_reference_of_other_rows() -> None:
    reference = ReferenceTrial(
        spec=ONE_ROW, peak_bytes=10, peak_device_bytes=10, step_time_ms=15.0, peak_phase=None
    )
    figures = reference_figures(reference, [], pin_step_time_ms=40.0, pin_spec=FOUR_ROWS)
    assert figures is not None
    assert figures.slowdown == pytest.approx(10.0 / 15.0 - 1.0)  # 1/3 faster per row
    same_rows = reference_figures(reference, [], pin_step_time_ms=40.0, pin_spec=ONE_ROW)
    assert same_rows is not None and same_rows.slowdown == pytest.approx(40.0 / 15.0 - 1.0)
