"""The re-verification's first runs, started on the slots the trials' tail leaves idle.

A search's trials end unevenly. In three 4-GPU searches of 20 trials on 16 slots (issue 44,
`benchmarks/results/h200x4-fast-start-2026-11-28/`: 164-201 s of a search the issue wants
within 180 s) the last trial or two ended 9-41 s after the others, with 14-15 slots idle,
and the re-verification's first round (a cold compile of each candidate, 55-59 s) began only
after them. On one H200, two of four slots were idle for the trials' last 55 s
(`benchmarks/results/h200-determinism-2026-11-29/`).

So once no trial is left to start, and while some still run, each slot that no trial holds
runs what the first round will surely run whatever those trials bring (`pin.first_round`):
the fitting references, the report's references that no candidate shares (where the round
has room for them), and those of the ``--top-k`` fastest fitting trials that the trials
still running cannot push out of it (with ``--top-k 3`` and one trial running, the two
fastest), each as many times as the round surely gives it (its first run cold where the
round's would be if no running trial joined it: on one GPU of four slots, a batch of four),
every first run before any second one; where the round leaves a slot free for each running
trial however it turns out (four GPUs: 16 slots, a round of 12-15 runs), the others of the
top-k get their cold first run too: a round waits for its slowest cold run, so one that
waited for the last trial cost its whole tail (9-24 s in three of four 4-GPU searches of
2026-11-28, whose last trial was no candidate). Each run is stored as a
``reverify`` of its trial as it comes in, exactly as a round stores it, and the round then
counts it (`fresh.stored_runs`) instead of running it again. When the last trial has
finished (`EarlyRound.finish`), the rest of the round's runs go out beside those still going,
and all are waited for before the rounds start; where no run started early, the rounds run
as ever.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import optuna

from budgettune.storage.trials import UNCONSTRAINED, record_of
from budgettune.storage.user_attrs import WORKER_ATTR
from budgettune.study.fresh import FreshJob, cold_once, launcher, run_batch, stored_runs
from budgettune.study.pin import RoundRun, first_round
from budgettune.study.spec import SearchSpec
from budgettune.study.target import NextStep, TrialCount
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun

if TYPE_CHECKING:
    from budgettune.study.searcher import Searcher

logger = logging.getLogger(__name__)

FirstRound = Callable[[Sequence[optuna.trial.FrozenTrial], SearchSpec, int, int], list[RoundRun]]
"""What the first round would run (`pin.first_round`)."""


def idle_slots(
    trials: Sequence[optuna.trial.FrozenTrial],
    devices: Sequence[str],
    busy: Counter[str],
    host: str,
) -> list[str]:
    """The device slots (``devices`` names each GPU once a slot) that neither a running trial
    of this host nor one of ``busy``'s runs holds, one entry a slot."""
    running = Counter(
        str(t.user_attrs.get(WORKER_ATTR, ""))
        for t in trials
        if t.state == optuna.trial.TrialState.RUNNING
    )
    free = {
        device: max(0, slots - running[f"{host}:{device}"] - busy[device])
        for device, slots in Counter(devices).items()
    }
    idle: list[str] = []
    while any(free.values()):  # the freest device first, then the next: spread over the GPUs
        device = max(free, key=lambda d: free[d])
        idle.append(device)
        free[device] -= 1
    return idle


class EarlyRound:
    """Runs the first round's runs on idle slots while the last trials run (module doc).

    ``poll`` is called by `workers.run_gpu_workers` once a poll, in the search's own thread;
    the runs go in threads of their own, and their results are stored by ``poll`` and
    ``finish`` in that same thread (as `fresh.run_batch`'s ``finish`` does).
    """

    def __init__(
        self,
        searcher: Searcher,
        on_first_finished: Callable[[], None] | None = None,
        plan: FirstRound = first_round,
    ) -> None:
        self.searcher = searcher
        self._on_first = on_first_finished
        self._plan = plan
        self._start = searcher.count().finished  # before the workers start
        self._on = True  # off after an error of its own: the rounds then run as ever
        self._busy: Counter[str] = Counter()
        self._going: Counter[str] = Counter()  # runs going, by job (its run folders' name)
        self._launched: Counter[str] = Counter()  # runs started, by job
        self._cold_going: set[str] = set()  # jobs whose cold run is going
        self._repeats: dict[str, set[int]] = {}  # run folder numbers taken, by job
        self._given_up: set[str] = set()  # jobs an early run of which raised
        self._done: queue.SimpleQueue[tuple[FreshJob, str, TrialResult | BaseException]] = (
            queue.SimpleQueue()
        )
        self.started: list[int] = []
        """The trial of each run started early, in order."""

    def poll(self, count: TrialCount) -> None:
        """After a poll of the study: tell the first finished trial, store the runs that
        came in, and start runs on the idle slots once no trial is left to start. An error
        of its own (the database busy, say) is logged and turns it off: never the search's."""
        if self._on_first is not None and count.finished > self._start:
            self._on_first()
            self._on_first = None
        self._keep_done()
        # only while trials run (with none left, the rounds run every run at once)
        if not self._on or len(self.searcher.devices) <= 1:
            return
        if count.next_step() is not NextStep.WAIT:
            return
        try:
            started = self._start_runs(running=count.running)
        except Exception:  # noqa: BLE001 - the search goes on without it
            logger.warning("early re-verification runs stopped", exc_info=True)
            self._on = False
            return
        if started:
            self.searcher.observer.notice(
                f"re-verifying trial{'s' if len(started) > 1 else ''} "
                f"{', '.join(map(str, started))} on idle slots while the last trials run"
            )

    def finish(self) -> None:
        """Once every trial has finished: where runs started early, the rest of the first
        round goes out as the round would run it (beside those still going, each on a slot as
        one frees), and all are waited for and stored, for the round to count; where none
        did, nothing (the round runs as ever)."""
        if not self.started:
            return
        while True:
            self._keep_done()
            if self._on:
                try:
                    self._start_runs(running=0)
                except Exception:  # noqa: BLE001 - the round runs what is missing
                    logger.warning("early re-verification runs stopped", exc_info=True)
                    self._on = False
            if not sum(self._busy.values()):
                return
            self._keep(self._done.get())  # a slot frees

    def _start_runs(self, *, running: int) -> list[int]:
        """Start what the first round will surely run (`pin.first_round`, with ``running``
        trials still to come in) on the idle slots, every job's first run before any second
        one: the trials they are of."""
        searcher = self.searcher
        trials = searcher.study.get_trials(deepcopy=False)
        if any(
            t.state == optuna.trial.TrialState.RUNNING
            and (WORKER_ATTR not in t.user_attrs or record_of(t).baseline == UNCONSTRAINED)
            for t in trials
        ):
            # a trial not yet placed holds a slot this cannot see; a run checked against the
            # unconstrained baseline's numerics waits for it
            return []
        idle = idle_slots(trials, searcher.devices, self._busy, socket.gethostname())
        plan = [
            r
            for r in self._plan(trials, searcher.search, searcher.fresh_slots, running)
            if r.job.run_name not in self._given_up
        ]
        if not idle or not plan:
            return []
        kept = stored_runs(searcher.store, searcher.search.study_name, [r.job for r in plan])
        started = []
        for level in range(max(r.runs for r in plan)):
            for (job, runs), old in zip(plan, kept, strict=True):
                name = job.run_name
                have = len(old) + self._going[name]
                # at most the round's runs of a job from here, whatever came of them (a
                # failed or uncounted one is the round's to run again)
                if idle and have == level < runs and self._launched[name] < runs:
                    # cold where none of its runs was (`fresh.cold_once`) or is going
                    [once] = cold_once([job], [old])
                    cold = once.cold and name not in self._cold_going
                    self._launch(dataclasses.replace(job, cold=cold), idle.pop(0), old)
                    started.append(job.number)
        self.started += started
        return started

    def _launch(self, job: FreshJob, device: str, old: Sequence[TrialResult]) -> None:
        searcher = self.searcher
        search = searcher.search
        launch = launcher(
            search.trial_timeout_s, searcher.servers, searcher.cpu_shares, search.trials_per_gpu
        )
        taken = self._repeats.setdefault(job.run_name, set())
        repeat = len(old)  # the next run folder no run of this job has or had
        while repeat in taken or (searcher.runs_dir / f"{job.run_name}-{repeat}").exists():
            repeat += 1
        taken.add(repeat)

        def make_run(spec: TrialSpec) -> TrialRun:
            return dataclasses.replace(search.trial_run(spec), device=device)

        def work() -> None:
            try:
                [[result]] = run_batch(
                    [job],
                    runs=1,
                    make_run=make_run,
                    runs_dir=searcher.runs_dir,
                    devices=[device],
                    launch=launch,
                    on_phase=lambda _: None,
                    first_repeat=[repeat],
                )
                self._done.put((job, device, result))
            except BaseException as exc:  # reported in the search's thread; a round re-runs it
                self._done.put((job, device, exc))

        self._busy[device] += 1
        self._going[job.run_name] += 1
        self._launched[job.run_name] += 1
        if job.cold:
            self._cold_going.add(job.run_name)
        thread = threading.Thread(target=work, name=f"early {job.run_name}", daemon=True)
        thread.start()

    def _keep_done(self) -> None:
        while True:
            try:
                self._keep(self._done.get_nowait())
            except queue.Empty:
                return

    def _keep(self, done: tuple[FreshJob, str, TrialResult | BaseException]) -> None:
        """Store one run that came in; one that raised, or that cannot be stored, is logged
        (the round runs it again) and no more of its job starts early."""
        job, device, outcome = done
        self._busy[device] -= 1
        self._going[job.run_name] -= 1
        if job.cold:
            self._cold_going.discard(job.run_name)
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            self.searcher.keep_run(job, outcome, self.searcher.unconstrained())
        except Exception as exc:  # noqa: BLE001 - the round measures it
            logger.warning("an early run of trial %d failed: %s", job.number, exc)
            self._given_up.add(job.run_name)
