"""Issue 44: the re-verification's first round starts on the slots the trials' tail leaves
idle (`budgettune.study.early_round`), and the rounds count what it measured."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from storage_samples import measured_trial, run_result

from budgettune.study import early_round
from budgettune.study.early_round import EarlyRound, idle_slots
from budgettune.study.fresh import FreshJob
from budgettune.study.pin import first_round
from budgettune.study.spec import SearchSpec
from budgettune.study.study import SearchObserver
from budgettune.study.target import TrialCount
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialSpec

State = optuna.trial.TrialState
HOST = socket.gethostname()


def _running(device: str, host: str = HOST) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        state=State.RUNNING, user_attrs={"worker": f"{host}:{device}"}
    )


def test_idle_slots_are_the_slots_no_running_trial_or_early_run_holds() -> None:
    devices = ["cuda:0", "cuda:1"] * 4  # two GPUs, four trials a GPU
    done = optuna.trial.create_trial(value=1.0, user_attrs={"worker": f"{HOST}:cuda:1"})
    trials = [
        *[_running("cuda:0")] * 3,
        _running("cuda:1"),
        done,  # finished: holds nothing
        _running("cuda:1", host="elsewhere"),  # a teammate's GPU, not ours
    ]
    assert Counter(idle_slots(trials, devices, Counter(), HOST)) == {"cuda:0": 1, "cuda:1": 3}
    busy = Counter({"cuda:0": 1, "cuda:1": 1})
    assert Counter(idle_slots(trials, devices, busy, HOST)) == {"cuda:1": 2}


def _trial(number: int, spec: TrialSpec, *, fits: bool, ms: float, label: str | None = None):
    return measured_trial(
        number, spec, fits=fits, ms=ms, label=label, peaks=(90_000_000, 200_000_000)
    )


def _study_trials() -> list[optuna.trial.FrozenTrial]:
    from budgettune.storage.trials import FULL_AC, UNCONSTRAINED

    return [
        _trial(0, TrialSpec(), fits=False, ms=8.0, label=UNCONSTRAINED),  # over the limit
        _trial(1, TrialSpec(block_ac_every=1), fits=True, ms=14.0, label=FULL_AC),
        _trial(2, TrialSpec(activation_memory_budget=0.5), fits=True, ms=10.0),
        _trial(3, TrialSpec(activation_memory_budget=0.6), fits=True, ms=11.0),
        _trial(4, TrialSpec(activation_memory_budget=0.3), fits=True, ms=12.0),
    ]


def _search(**changes) -> SearchSpec:
    from budgettune.study.space import SearchSpace

    return SearchSpec(
        workload="builtin:tiny-gpt",
        device="cuda:0",
        max_mem_bytes=100_000_000,
        study_name="s",
        space=SearchSpace.for_device("cuda"),
        **{"top_k": 2, **changes},
    )


def test_the_first_round_is_the_top_k_and_the_references_then_the_report_baseline() -> None:
    trials = _study_trials()
    # one GPU, 4 slots: the two fastest and full block AC (a fitting reference), one cold run
    # each; then the over-limit baseline's three runs for the report
    plan = first_round(trials, _search(), 4)
    assert [(r.job.number, r.job.cold, r.runs, r.job.check) for r in plan] == [
        (2, True, 1, True),
        (3, True, 1, True),
        (1, True, 1, True),  # a reference: in the round whatever comes in
        (0, False, 1, False),  # for the report (the numerics reference itself): room for it
    ]
    assert plan[3].job.run_name == "reverify-unconstrained-0000"
    # four GPUs, 16 slots: the round holds three runs of each of the three
    assert [r.runs for r in first_round(trials, _search(), 16)] == [3, 3, 3, 3]
    # two slots do not hold the three at once: only the fastest starts cold, and the report's
    # baseline waits for a later round (as the round has it)
    assert [r.job.cold for r in first_round(trials, _search(), 2)] == [True, False, False]


def test_what_the_running_trials_may_change_is_left_out_of_the_first_round() -> None:
    trials = _study_trials()

    def plan(slots: int, running: int, top_k: int = 2) -> list[tuple[int, bool, int]]:
        found = first_round(trials, _search(top_k=top_k), slots, running)
        return [(r.job.number, r.job.cold, r.runs) for r in found]

    # --top-k 2, one running: it may take trial 3's place (trial 2 stays in the top 2) and
    # grow the batch to 4; on 16 slots every first run is cold whatever comes in, but the
    # round may give each only 3 runs (16 // 4 is 4: capped at --reverify-runs 3); the round
    # takes at most 12 slots (15 with the baseline's), so trial 3 gets its cold run now: if
    # pushed out, it holds one slot the round does not need
    assert plan(16, 1) == [(2, True, 3), (3, True, 1), (1, True, 3), (0, False, 3)]
    # on 14 slots: the round with the baseline's may take 15: trial 3's run, not the baseline's
    assert plan(14, 1) == [(2, True, 3), (3, True, 1), (1, True, 3)]
    # on 8 slots: 2 runs each at 4 (16 // 4 would be 4), the report's baseline has no room
    assert plan(8, 1) == [(2, True, 2), (1, True, 2)]
    # 4 slots hold the 4 the batch may grow to: all cold, one run each
    assert plan(4, 1) == [(2, True, 1), (1, True, 1)]
    # 3 in the batch fit 3 slots, 4 would not: each starts cold as if none joined (one that
    # joins only takes cold starts away: a cold run more at worst); trial 3 may be pushed out
    assert plan(3, 1) == [(2, True, 1), (1, True, 1)]
    # 2 slots: cold only for the fastest (a running trial may become it: a cold run more)
    assert plan(2, 1) == [(2, True, 1), (1, False, 1)]
    assert plan(2, 0) == [(2, True, 1), (3, False, 1), (1, False, 1)]
    # two running with --top-k 2: no candidate is sure to stay, full block AC is; at 5 in
    # the batch the baseline's 3 runs would not fit beside 5 x 3 on 16 slots, nor two runs
    # the round might not need
    assert plan(16, 2) == [(1, True, 3)]
    # on 24 slots they fit: each candidate's cold run goes now
    assert plan(24, 2) == [(2, True, 1), (3, True, 1), (1, True, 3), (0, False, 3)]
    assert first_round(trials[:1], _search(), 16) == []  # nothing fits yet: nothing to run
    # full block AC second fastest, one running, 4 slots (no room for a wasted run): pushed
    # out of the top 2 or not, a reference stays in the round, so its run goes now
    from budgettune.storage.trials import FULL_AC

    fast_ac = [*trials[:1], _trial(1, TrialSpec(block_ac_every=1), fits=True, ms=10.5,
               label=FULL_AC), *trials[2:]]  # fmt: skip
    found = first_round(fast_ac, _search(), 4, running=1)
    assert [(r.job.number, r.job.cold, r.runs) for r in found] == [(2, True, 1), (1, True, 1)]


@dataclass
class _Measurement:
    trial_number: int
    spec: TrialSpec
    result: TrialResult
    device_name: str = "NVIDIA H200"
    torch_version: str = "2.11.0"

    def to_result(self) -> TrialResult:
        return self.result


@dataclass
class _Store:
    """What `fresh.stored_runs` reads: the trials' measurements, and the runs kept."""

    trials: list[optuna.trial.FrozenTrial]
    kept: list[tuple[FreshJob, TrialResult]] = field(default_factory=list)

    def measurements(self, study_name, kind):
        if kind == "trial":
            return [_Measurement(t.number, TrialSpec(), run_result(1, 1.0)) for t in self.trials]
        return [_Measurement(job.number, job.spec, result) for job, result in self.kept]


@dataclass
class _Study:
    trials: list[optuna.trial.FrozenTrial]

    def get_trials(self, deepcopy=False):
        return self.trials


@dataclass
class _Searcher:
    trials: list[optuna.trial.FrozenTrial]
    devices: tuple[str, ...] = ("cuda:0",) * 4
    search: SearchSpec = field(default_factory=_search)
    observer: SearchObserver = field(default_factory=SearchObserver)
    runs_dir: Path = Path("/nonexistent")
    servers: None = None
    cpu_shares: dict[str, str] = field(default_factory=dict)
    kept: list[tuple[int, bool, TrialResult]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.study = _Study(self.trials)
        self.store = _Store(self.trials)
        self.fresh_slots = len(self.devices)

    def unconstrained(self):
        return None

    def count(self) -> TrialCount:
        return _count(finished=0, running=0)

    def keep_run(self, job: FreshJob, result: TrialResult, ref) -> TrialResult:
        self.kept.append((job.number, job.cold, result))
        self.store.kept.append((job, result))
        return result


def _count(finished: int, running: int, target: int = 5) -> TrialCount:
    return TrialCount(
        target=target, counted=finished + running, finished=finished, waiting=0, running=running
    )


def _wait_for(condition) -> None:
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_early_runs_start_on_idle_slots_and_the_round_is_completed_at_the_end(
    monkeypatch,
) -> None:
    release = threading.Event()
    launched: list[tuple[int, bool, str, int]] = []

    def run_batch(jobs, *, runs, make_run, runs_dir, devices, launch, on_phase, first_repeat):
        [job] = jobs
        run = make_run(job.spec)
        launched.append((job.number, job.cold, run.device, first_repeat[0]))
        release.wait(5)
        return [[run_result(90, 10.0, cold=job.cold)]]

    monkeypatch.setattr(early_round, "run_batch", run_batch)
    last = [_running("cuda:0"), _running("cuda:0")]
    trials = _study_trials() + last  # the last two trials still run
    searcher = _Searcher(trials, devices=("cuda:0",) * 8)  # 8 trials a GPU
    said: list[str] = []
    searcher.observer.notice = said.append  # type: ignore[method-assign]
    warmed: list[int] = []
    early = EarlyRound(searcher, on_first_finished=lambda: warmed.append(1))  # type: ignore[arg-type]

    early.poll(_count(finished=0, running=4, target=7))  # nothing finished yet
    early.poll(_count(finished=3, running=2, target=7))  # a trial left to start: none early
    assert launched == [] and warmed == [1]
    early.poll(_count(finished=5, running=2, target=7))  # the last two run: 6 slots idle
    _wait_for(lambda: len(launched) == 1)
    # two trials could push both candidates (--top-k 2) out, and the baseline's runs may
    # find no room: what the round surely runs is full block AC's cold run, one of its two
    assert launched == [(1, True, "cuda:0", 0)]
    assert said == ["re-verifying trial 1 on idle slots while the last trials run"]
    early.poll(_count(finished=5, running=2, target=7))  # started already: nothing more
    assert len(launched) == 1
    # the trials end: the rest of the round (3 in the batch: 2 runs each on 8 slots, the
    # first cold; the baseline's 2 with them) goes out beside it, all stored for the round
    for trial in last:
        trials.remove(trial)
    release.set()
    early.finish()
    assert sorted((n, cold) for n, cold, _, _ in launched) == [
        (0, False),
        (0, False),
        (1, False),
        (1, True),
        (2, False),
        (2, True),
        (3, False),
        (3, True),
    ]
    repeats = sorted((n, repeat) for n, _, _, repeat in launched)
    assert repeats == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert len(searcher.kept) == 8
    assert early._busy == Counter({"cuda:0": 0}) and all(v == 0 for v in early._going.values())
    plan = first_round(trials, searcher.search, searcher.fresh_slots)  # the round's batch
    from budgettune.study.fresh import stored_runs

    counted = stored_runs(searcher.store, "s", [r.job for r in plan])  # type: ignore[arg-type]
    assert [len(runs) for runs in counted] == [2, 2, 2, 2]


def test_with_one_trial_running_the_fastest_cannot_be_pushed_out(monkeypatch) -> None:
    launched: list[int] = []

    def run_batch(jobs, **kwargs):
        launched.append(jobs[0].number)
        return [[run_result(90, 10.0, cold=jobs[0].cold)]]

    monkeypatch.setattr(early_round, "run_batch", run_batch)
    trials = _study_trials() + [_running("cuda:0", host="elsewhere")]  # a teammate's: 4 idle
    searcher = _Searcher(trials)
    early = EarlyRound(searcher)  # type: ignore[arg-type]
    early.poll(_count(finished=5, running=1, target=6))
    _wait_for(lambda: len(launched) >= 2)
    # --top-k 2, one running: trial 2 stays in the top 2 whatever it brings, trial 3 may not
    assert sorted(launched) == [1, 2]  # the baseline's run may find no room if one comes
    early.finish()  # nothing running any more: trial 3's run goes out now, the baseline's too
    assert sorted(launched) == [0, 1, 2, 3]


def test_on_one_gpu_the_sure_cold_runs_start_beside_the_last_trial(monkeypatch) -> None:
    # one H200, four slots, --top-k 3 (2026-11-29, h200-new-cold-2026-11-29): with the last
    # trial running, the batch (3 candidates and full block AC) fills the four slots only if
    # it does not join, and the early round started nothing while slots stood idle 50-62 s
    launched: list[tuple[int, bool]] = []

    def run_batch(jobs, **kwargs):
        launched.append((jobs[0].number, jobs[0].cold))
        return [[run_result(90, 10.0, cold=jobs[0].cold)]]

    monkeypatch.setattr(early_round, "run_batch", run_batch)
    trials = _study_trials() + [_running("cuda:0")]  # three slots idle
    searcher = _Searcher(trials, search=_search(top_k=3))
    early = EarlyRound(searcher)  # type: ignore[arg-type]
    early.poll(_count(finished=5, running=1, target=6))
    _wait_for(lambda: len(launched) >= 3)
    # the two fastest (sure to stay in the top 3) and full block AC, cold; the third may be
    # pushed out and the baseline may find no room: they wait for the trial
    assert sorted(launched) == [(1, True), (2, True), (3, True)]
    trials.pop()  # the trial ends (no candidate): the rest of the round goes out, cold
    early.finish()  # (the baseline's run has no room in it: a later round's, as on the GPU)
    assert sorted(launched) == [(1, True), (2, True), (3, True), (4, True)]


@pytest.mark.parametrize(("last_ms", "counted"), [(13.0, [2, 3, 1, 0]), (10.5, [2, 5, 1, 0])])
def test_a_candidate_the_last_trial_may_push_out_starts_cold_on_four_gpus(
    monkeypatch, last_ms: float, counted: list[int]
) -> None:
    # 16 slots (four GPUs, four trials each), the last trial still running: trial 3 (the
    # second of --top-k 2) gets its cold run beside the sure ones; the last trial comes in
    # slower (13 ms: trial 3 stays, its early run is the round's) or faster (10.5 ms: trial 5
    # takes its place, trial 3's run is kept but not counted, trial 5's cold run goes out)
    launched: list[tuple[int, bool]] = []

    def run_batch(jobs, *, runs, make_run, runs_dir, devices, launch, on_phase, first_repeat):
        [job] = jobs
        launched.append((job.number, job.cold))
        return [[run_result(90, 10.0, cold=job.cold)]]

    monkeypatch.setattr(early_round, "run_batch", run_batch)
    last = _running("cuda:3")
    trials = _study_trials() + [last]
    devices = tuple(f"cuda:{g}" for g in range(4) for _ in range(4))
    searcher = _Searcher(trials, devices=devices)
    early = EarlyRound(searcher)  # type: ignore[arg-type]
    early.poll(_count(finished=5, running=1, target=6))
    _wait_for(lambda: len(launched) >= 10)
    first = sorted(launched)
    # 3 runs of trial 2 and of full block AC (1), the baseline's 3, trial 3's cold one
    expected = [(2, True), (2, False), (2, False), (1, True), (1, False), (1, False)]
    assert first == sorted([*expected, (0, False), (0, False), (0, False), (3, True)])
    trials.remove(last)
    trials.append(_trial(5, TrialSpec(activation_memory_budget=0.7), fits=True, ms=last_ms))
    early.finish()
    plan = first_round(trials, searcher.search, searcher.fresh_slots)  # the round's batch
    assert [r.job.number for r in plan] == counted
    from budgettune.study.fresh import stored_runs

    kept = stored_runs(searcher.store, "s", [r.job for r in plan])  # type: ignore[arg-type]
    assert [len(runs) for runs in kept] == [r.runs for r in plan] == [3, 3, 3, 3]
    assert [any(run.cold_caches for run in runs) for runs in kept[:3]] == [True] * 3
    assert (3, True) in launched  # pushed out or not, its run was made (and stored)
    assert len(launched) == 12 + (counted != [2, 3, 1, 0])  # trial 3's run wasted or not


def test_no_early_run_once_every_trial_has_finished_or_on_one_slot(monkeypatch) -> None:
    monkeypatch.setattr(early_round, "run_batch", lambda *a, **k: pytest.fail("ran"))
    early = EarlyRound(_Searcher(_study_trials()))  # type: ignore[arg-type]
    early.poll(_count(finished=5, running=0))  # all in: the rounds run everything at once
    single = EarlyRound(_Searcher(_study_trials() + [_running("cuda:0")], devices=("cuda:0",)))  # type: ignore[arg-type]
    single.poll(_count(finished=5, running=1, target=6))
    early.finish()
    single.finish()


def test_a_failed_early_run_is_logged_and_left_to_the_rounds(monkeypatch, caplog) -> None:
    def run_batch(jobs, **kwargs):
        raise OSError("the run folder went away")

    monkeypatch.setattr(early_round, "run_batch", run_batch)
    searcher = _Searcher(_study_trials() + [_running("cuda:0")])
    early = EarlyRound(searcher)  # type: ignore[arg-type]
    early.poll(_count(finished=5, running=1, target=6))
    early.finish()
    assert searcher.kept == []  # nothing stored: the round measures it
    assert "an early run of trial 2 failed: the run folder went away" in caplog.text
    assert early._busy["cuda:0"] == 0


def test_with_a_real_study_the_round_counts_the_early_run_and_runs_it_no_more(
    tmp_path: Path, monkeypatch
) -> None:
    """The real Searcher and SQLite: the early run goes through `fresh.run_batch` (its run
    folder, its cold caches), is stored as a ``reverify`` of its trial, and the round's
    `Searcher.fresh_batch` then counts it and launches nothing."""
    import dataclasses

    from budgettune import storage
    from budgettune.study import searcher as searcher_mod
    from budgettune.study.searcher import Searcher
    from budgettune.study.study_file import build_search_spec

    launched: list[tuple[str, str, bool]] = []

    def fake_launcher(timeout_s: float, servers=None, cpu_shares=None, sharing=1):
        def launch(run, run_dir: Path) -> TrialResult:
            cold = run.cache_root is not None and run.cache_root.endswith("cold-caches")
            launched.append((run_dir.name, run.device, cold))
            return dataclasses.replace(run_result(90_000_000, 20.5, cold=cold), device_name="cpu")

        return launch

    monkeypatch.setattr(early_round, "launcher", fake_launcher)
    monkeypatch.setattr(searcher_mod, "launcher", fake_launcher)
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    spec = TrialSpec(compile_mode="eager", activation_memory_budget=0.5)
    study = optuna.create_study(study_name="s", storage=url)
    done = _trial(0, spec, fits=True, ms=20.0)
    study.add_trial(optuna.trial.create_trial(value=20.0, user_attrs=done.user_attrs))
    study.add_trial(_running("cpu"))  # the last trial, still running on this host's slot
    search = build_search_spec(
        {
            "workload": "builtin:tiny-gpt",
            "max_mem": "100MB",
            "study": "s",
            "storage": url,
            "runs_dir": str(tmp_path / "runs"),
            "top_k": 2,  # one trial running cannot push the fastest out of the top 2
            "reverify": 1,
        },
        default_device="cpu",
    )
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = Searcher(search, store, add_trials=False, devices=["cpu", "cpu"])
        try:
            searcher._store(
                0, "trial", spec, dataclasses.replace(run_result(1, 20.0), device_name="cpu")
            )
            early = EarlyRound(searcher)
            early.poll(_count(finished=1, running=1, target=2))
            early.finish()
            assert launched == [("reverify-0000-0", "cpu", True)]
            assert [m.trial_number for m in store.measurements("s", kind="reverify")] == [0]
            job = first_round(searcher.study.get_trials(deepcopy=False), search, 2)[0].job
            (runs,) = searcher.fresh_batch([job], runs=1)
            assert [r.cold_caches for r in runs] == [True] and len(launched) == 1
        finally:
            searcher.claim.close()


@pytest.mark.parametrize("slots", [2, 3, 4, 8, 16])
def test_with_no_trial_running_the_plan_is_what_the_round_asks_for_first(slots: int) -> None:
    """`pin.first_round` mirrors `reverify_until_one_fits`'s first batch: the same jobs, cold
    starts and runs, the report's baseline where the round takes it."""
    from budgettune.study.pin import (
        fitting_references,
        pin_candidates,
        report_alongside,
        report_references,
        reverify_until_one_fits,
    )

    trials = _study_trials()
    search = _search()
    asked: list[list[tuple[int, bool, int]]] = []

    class Round:
        def __init__(self) -> None:
            self.search, self.fresh_slots = search, slots
            self.observer = SearchObserver()

        def fresh_batch(self, jobs, runs=None):
            asked.append([(job.number, job.cold, runs) for job in jobs])
            return [
                [run_result(90_000_000, 10.0 + job.number, cold=job.cold)] * runs for job in jobs
            ]

    candidates = pin_candidates(trials, search)
    _, report = report_references(trials, search)
    reverify_until_one_fits(
        Round(),  # type: ignore[arg-type]
        candidates,
        list(fitting_references(trials, candidates).values()),
        alongside=report_alongside(trials, report, candidates),
    )
    plan = first_round(trials, search, slots)
    assert [(r.job.number, r.job.cold, r.runs) for r in plan] == asked[0]
