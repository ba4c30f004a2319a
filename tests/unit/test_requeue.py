"""Issue 29, items 5 and 6: a trial stopped by an interrupt (SIGINT, SIGTERM) or by its run
folder failing is no verdict on its configuration: it is failed and queued again with Optuna's
retry bookkeeping, excludes nothing, and the next search measures it, a baseline included.
A real Searcher on a real SQLite study; only the trial launcher is replaced."""

from __future__ import annotations

import signal
from pathlib import Path

import optuna
import pytest
from storage_samples import ok_result

from budgettune import storage
from budgettune.errors import TrialInfrastructureError
from budgettune.storage.trials import BASELINE_ATTR, EXCLUDED_ATTR, FULL_AC, UNCONSTRAINED
from budgettune.storage.user_attrs import RETRY_HISTORY_ATTR
from budgettune.study import searcher as searcher_module
from budgettune.study.searcher import Searcher
from budgettune.study.study_file import build_search_spec
from budgettune.trial.processes import Terminated, interrupts_kept, sigterm_raises
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialSpec

State = optuna.trial.TrialState
OPENING = [UNCONSTRAINED, FULL_AC, "budget-0.5"]


def _searcher(url: str, runs_dir: Path, store: storage.Storage) -> Searcher:
    search = build_search_spec(
        {
            "workload": "builtin:tiny-gpt",
            "max_mem": "20GB",  # storage_samples' ok_result peaks at 14.05 GB
            "trials": 3,
            "study": "s",
            "storage": url,
            "runs_dir": str(runs_dir),
            "space": {"backend": "aot_eager_decomp_partition"},
        },
        default_device="cpu",
    )
    return Searcher(search, store)


class _Launches:
    """Stands in for `launch_trial`: raises what ``faults`` holds, in turn, then measures."""

    def __init__(self, *faults: BaseException | None) -> None:
        self.faults = list(faults)
        self.specs: list[TrialSpec] = []

    def __call__(self, run, *, run_dir, timeout_s, servers=None) -> TrialResult:
        self.specs.append(run.spec)
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            raise fault
        return ok_result()


def test_an_interrupted_baseline_is_queued_again_and_measured_by_the_next_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    launches = _Launches(KeyboardInterrupt(), Terminated("terminated by SIGTERM"))
    monkeypatch.setattr(searcher_module, "launch_trial", launches)
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = _searcher(url, tmp_path / "runs", store)
        for _ in range(2):  # Ctrl-C during the unconstrained baseline, SIGTERM during full AC
            searcher.claim.acquire()
            with pytest.raises(KeyboardInterrupt):
                searcher.run_one_trial()
            searcher.claim.release()
        trials = searcher.study.get_trials()
        assert [t.state for t in trials] == [State.FAIL, State.FAIL] + [State.WAITING] * 3
        copies = trials[3:]
        assert [c.system_attrs[RETRY_HISTORY_ATTR] for c in copies] == [[0], [1]]
        assert [c.user_attrs[BASELINE_ATTR] for c in copies] == [UNCONSTRAINED, FULL_AC]
        assert [c.user_attrs["enqueued_spec"] for c in copies] == [
            t.user_attrs["enqueued_spec"] for t in trials[:2]
        ]
        count = searcher.count()  # the originals do not count, their copies do
        assert (count.counted, count.waiting, count.target) == (3, 3, 3)

        searcher.run_trials()  # the next search: the three queued trials, then the target
        trials = searcher.study.get_trials()
        searcher.claim.close()
    assert len(trials) == 5 and all(t.state == State.COMPLETE for t in trials[2:])
    measured = {t.user_attrs[BASELINE_ATTR] for t in trials if "outcome" in t.user_attrs}
    assert measured == set(OPENING)  # every baseline of the opening, none lost
    full_ac = TrialSpec.from_json_dict(trials[1].user_attrs["enqueued_spec"])
    assert launches.specs[-1] == full_ac and full_ac.block_ac_every == 1  # measured as given


def test_a_folder_fault_excludes_nothing_stops_in_one_line_and_the_trial_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    fault = TrialInfrastructureError("a trial could not use /runs/s (Not a directory): ...")
    monkeypatch.setattr(searcher_module, "launch_trial", _Launches(None, fault))
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = _searcher(url, tmp_path / "runs", store)
        with pytest.raises(TrialInfrastructureError) as raised:
            searcher.run_trials()  # the unconstrained baseline ran; full AC's folder failed
        study = searcher.study
        trials = study.get_trials()
        searcher.claim.close()
    line = str(raised.value)
    assert line.startswith("trial 1: a trial could not use /runs/s") and "\n" not in line
    assert "nothing is excluded" in line and "runs the trial again" in line
    assert EXCLUDED_ATTR not in study.user_attrs  # block AC is not "excluded after crashes"
    assert trials[1].state == State.FAIL and "outcome" not in trials[1].user_attrs
    assert "Not a directory" in trials[1].user_attrs["error"]  # what `show` says of it
    copy = trials[-1]
    assert copy.state == State.WAITING and copy.user_attrs[BASELINE_ATTR] == FULL_AC
    assert copy.system_attrs[RETRY_HISTORY_ATTR] == [1]


def test_a_sigterm_swallowed_while_a_child_forks_is_raised_again() -> None:
    """Like a Ctrl-C (`test_launcher_unit`): a SIGTERM landing in an at-fork hook is kept."""
    with pytest.raises(Terminated), sigterm_raises(), interrupts_kept():
        try:
            signal.raise_signal(signal.SIGTERM)
        except Terminated:
            pass  # what CPython does with an exception raised in an at-fork hook
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored by both
