"""Re-verification walks down the fitting trials until one holds (issue 12), and the one rule
of "fits" the search, the pin and show share."""

from __future__ import annotations

from dataclasses import dataclass, field

from budgettune.pinning import Candidate, allocator_advice, fits_limit, margin_violation_bytes
from budgettune.search.pin import MAX_CANDIDATES, margin_advice, reverify_until_one_fits
from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec


def _result(peak: int, ms: float) -> TrialResult:
    return TrialResult(
        outcome=TrialOutcome.OK,
        measurement=Measurement(
            peak_allocated_bytes=peak,
            peak_reserved_bytes=peak,
            peak_device_bytes=peak,
            steady_bytes=1,
            phase_peak_bytes={"backward": peak},
            peak_phase="backward",
            step_time_ms=ms,
            step_time_p10_ms=ms,
            step_time_p90_ms=ms,
            compile_s=0.0,
            loss=1.0,
            grad_norm=1.0,
        ),
    )


@dataclass
class _Search:
    top_k: int = 2
    max_mem_bytes: int = 100
    mem_metric: str = "device"
    margin: float = 0.03
    host_limit_bytes: int = 10**12
    offload_searched: bool = False


@dataclass
class _Observer:
    lines: list[str] = field(default_factory=list)

    def notice(self, text: str) -> None:
        self.lines.append(text)


@dataclass
class _Searcher:
    """What the walk needs of a Searcher: its search, observer and fresh runs (by table)."""

    peaks: dict[int, int]
    search: _Search = field(default_factory=_Search)
    observer: _Observer = field(default_factory=_Observer)
    measured: list[int] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)

    def fresh_batch(self, jobs):
        self.measured.extend(job.number for job in jobs)
        self.batches.append([job.number for job in jobs])
        return [[_result(self.peaks[job.number], 10.0 + job.number)] * 2 for job in jobs]


def _candidates(n: int) -> list[Candidate]:
    return [
        Candidate(trial_number=i, spec=TrialSpec(seed=i), step_time_ms=10.0 + i, peak_bytes=90)
        for i in range(n)
    ]


def test_walks_past_the_top_k_until_one_fits_and_says_each_step() -> None:
    # trials 0 and 1 (the top-k) re-measure at 98 > 100 / 1.03; trial 2 at 95 fits; 3 is never run
    searcher = _Searcher(peaks={0: 98, 1: 98, 2: 95, 3: 90})
    found = reverify_until_one_fits(searcher, _candidates(4))  # type: ignore[arg-type]
    assert found is not None
    (winner, runs), reverified = found
    assert winner.trial_number == 2 and len(runs) == 2
    assert searcher.measured == [0, 1, 2] and sorted(reverified) == [0, 1, 2]
    assert searcher.batches == [[0, 1], [2]]  # the top-k go out together (parallel on GPUs)
    assert len(searcher.observer.lines) == 1
    assert "trying trial 2 (3/4" in searcher.observer.lines[0]


def test_the_top_k_are_compared_together_fastest_median_wins() -> None:
    searcher = _Searcher(peaks={0: 95, 1: 90, 2: 80})
    found = reverify_until_one_fits(searcher, _candidates(3))  # type: ignore[arg-type]
    assert found is not None and found[0][0].trial_number == 0
    assert searcher.measured == [0, 1] and searcher.observer.lines == []


def test_the_walk_is_bounded_and_none_means_exit_3() -> None:
    n = MAX_CANDIDATES + 3
    searcher = _Searcher(peaks={i: 99 for i in range(n)})
    assert reverify_until_one_fits(searcher, _candidates(n)) is None  # type: ignore[arg-type]
    assert searcher.measured == list(range(MAX_CANDIDATES))


def test_fits_is_peak_times_one_plus_margin_within_the_limit() -> None:
    assert fits_limit(97, limit_bytes=100, margin=0.03)
    assert not fits_limit(98, limit_bytes=100, margin=0.03)
    assert margin_violation_bytes(100, limit_bytes=100, margin=0.0) == 0
    assert margin_violation_bytes(50, limit_bytes=100, margin=0.1) < 0


def test_exit_3_says_when_only_the_margin_keeps_the_smallest_peak_out() -> None:
    # seen on an H200: limit 1.02 x full AC's peak, searched with the 2 % margin
    search = _Search(max_mem_bytes=100, margin=0.03)
    assert "only the 3% margin keeps it out" in margin_advice(98, search)  # type: ignore[arg-type]
    assert "--margin" in margin_advice(100, search)  # type: ignore[arg-type]
    assert margin_advice(101, search) == ""  # type: ignore[arg-type]  # over the limit itself
    assert margin_advice(90, _Search(margin=0.0)) == ""  # type: ignore[arg-type]


def test_allocator_advice_only_for_a_large_reserve_on_the_binding_metric() -> None:
    gap = dict(peak_allocated_bytes=75_300_000_000, peak_reserved_bytes=107_800_000_000)
    advice = allocator_advice(mem_metric="device", alloc_conf="", **gap)
    assert "32.50 GB above" in advice and "expandable_segments:True" in advice
    assert allocator_advice(mem_metric="allocated", alloc_conf="", **gap) == ""
    expandable = "expandable_segments:True"
    assert allocator_advice(mem_metric="reserved", alloc_conf=expandable, **gap) == ""
    small = dict(peak_allocated_bytes=100, peak_reserved_bytes=110)
    assert allocator_advice(mem_metric="device", alloc_conf="", **small) == ""


def test_exit_3_line_names_the_margin_only_for_an_ok_trial_under_the_limit() -> None:
    import optuna

    from budgettune.search.pin import no_feasible_error

    def trial(peak: int, outcome: str) -> optuna.trial.FrozenTrial:
        attrs = {"peak_device_bytes": peak, "outcome": outcome, "spec": TrialSpec().to_json_dict()}
        return optuna.trial.create_trial(value=1.0, user_attrs=attrs)

    @dataclass
    class _Study:
        trials: list[optuna.trial.FrozenTrial]

        def get_trials(self, deepcopy: bool = False) -> list[optuna.trial.FrozenTrial]:
            return self.trials

    @dataclass
    class _WithStudy:
        study: _Study
        search: _Search = field(default_factory=_Search)
        runs_dir: str = "runs"

    ok_in_margin = _WithStudy(_Study([trial(99, "ok"), trial(120, "ok")]))
    assert "lower --margin" in str(no_feasible_error(ok_in_margin))  # type: ignore[arg-type]
    assert "lower --margin" not in str(
        no_feasible_error(ok_in_margin, after_reverify=True)  # type: ignore[arg-type]
    )
    wrong_numerics = _WithStudy(_Study([trial(99, "numerics_mismatch"), trial(120, "ok")]))
    line = str(no_feasible_error(wrong_numerics))  # type: ignore[arg-type]
    assert "smallest peak seen is" in line and "lower --margin" not in line
