"""Issue 12: a pin when the unconstrained baseline cannot run, and a search that survives its
teammates (one heartbeat per study, a trial failed under a live process, one CPU trial at a
time per host). Real SQLite studies and real tiny-GPT trials on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from budgettune import storage
from budgettune.cli import app
from budgettune.present.report import study_report
from budgettune.search.searcher import Searcher
from budgettune.search.study import SearchObserver
from budgettune.search.study_file import build_search_spec
from budgettune.trial.launcher import CPU_LOCK_ENV, cpu_trial_lock
from budgettune.trial.spec import TrialSpec

FAST = TrialSpec(compile_backend="aot_eager_decomp_partition", warmup_steps=1, timed_steps=1)
runner = CliRunner()


def _search(url: str, runs_dir: Path, *, limit: str = "500MB", study: str = "s"):
    return build_search_spec(
        {
            "workload": "builtin:tiny-gpt",
            "max_mem": limit,
            "study": study,
            "storage": url,
            "runs_dir": str(runs_dir),
            "timeout": 300,
            "top_k": 1,
            "reverify": 1,
            "space": {"backend": "aot_eager_decomp_partition"},
            "trial": {"warmup_steps": 1, "timed_steps": 1},
        },
        default_device="cpu",
    )


class _Lines(SearchObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def notice(self, text: str) -> None:
        self.lines.append(text)


def _measured(label: str, spec: TrialSpec, *, peak: int, ms: float, state=TrialState.COMPLETE):
    attrs = {
        "baseline": label, "outcome": "ok", "spec": spec.to_json_dict(), "step_time_ms": ms,
        "peak_device_bytes": peak, "peak_reserved_bytes": peak, "peak_allocated_bytes": peak,
        "steady_bytes": 1, "peak_phase": "backward", "loss": 1.0, "grad_norm": 1.0,
        "constraint": [peak * 1.03 - 500e6],
    }  # fmt: skip
    return create_trial(state=state, value=ms if state == TrialState.COMPLETE else None,
                        user_attrs=attrs)  # fmt: skip


def test_baseline_out_of_memory_pins_and_reports_vs_full_block_ac(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    oom = {"baseline": "unconstrained", "outcome": "oom", "spec": FAST.to_json_dict(),
           "constraint": [500e6]}  # fmt: skip
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs=oom))
    study.add_trial(_measured("block-ac-every-1", FAST.replace(block_ac_every=1), peak=93_000_000,
                              ms=30.0))  # fmt: skip
    study.add_trial(
        _measured("budget-0.5", FAST.replace(activation_memory_budget=0.5), peak=120e6, ms=20.0)
    )
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = Searcher(_search(url, tmp_path / "runs"), store, add_trials=False)
        pin = searcher.pin()
        searcher.claim.close()
    assert pin["baseline"] is None and pin["baseline_status"] == "oom"
    assert pin["spec"]["activation_memory_budget"] == 0.5  # the fastest that fits, re-measured
    full_ac = pin["full_ac"]
    assert full_ac["runs"] == 1 and full_ac["spec"]["block_ac_every"] == 1
    assert full_ac["slowdown"] == pin["measured"]["step_time_ms"] / full_ac["step_time_ms"] - 1
    report = study_report(url, "s")
    assert report.baseline_status == "oom"
    assert [r.slowdown_vs_full_ac is not None for r in report.rows] == [False, True, True]
    assert report.pin is not None and report.pin["full_ac"]["runs"] == 1
    shown = runner.invoke(app, ["show", "--storage", url])
    assert shown.exit_code == 0, shown.output
    assert "vs full block AC" in shown.stdout and "cannot run: oom" in shown.stdout


def test_a_worker_asking_for_another_heartbeat_is_told_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        Searcher(_search(url, tmp_path / "runs"), store).claim.close()
    result = runner.invoke(
        app, ["worker", "--study", "s", "--storage", url, "--device", "cpu", "--heartbeat-s", "3"]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "uses a trial heartbeat of 10 s" in lines[0]


def test_a_trial_failed_by_another_process_is_said_once_and_the_loop_goes_on(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"

    class FailedUnderneath(Searcher):
        """Another worker's stale-trial check fails the running trial (its heartbeat missed)."""

        def spec_for(self, trial):
            spec = super().spec_for(trial)  # then, while the trial is measured, the stale check
            with storage.open_storage(url) as other:
                other.optuna_storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            return spec

    observer = _Lines()
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = FailedUnderneath(_search(url, tmp_path / "runs"), store, observer)
        searcher.run_trials(max_trials=2)  # no `ValueError: Cannot tell a FAIL trial`
        searcher.claim.close()
    assert len(observer.lines) == 2
    assert all("failed by another process's stale-trial check" in line for line in observer.lines)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in trials[:2]] == [TrialState.FAIL, TrialState.FAIL]
    with storage.open_storage(url) as store:  # the measurements are kept
        assert len(store.measurements("s")) == 2


def test_cpu_trials_take_turns_on_a_host(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CPU_LOCK_ENV, str(tmp_path / "cpu.lock"))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time\nfrom budgettune.trial.launcher import cpu_trial_lock\n"
         "with cpu_trial_lock():\n    print('held', flush=True)\n    time.sleep(2)\n"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with cpu_trial_lock():
        waited = time.monotonic() - started
    holder.wait(timeout=30)
    assert waited > 1.0, waited  # it waited for the other CPU trial to finish
    # one lock file for every user of the host, whatever their umask
    assert (tmp_path / "cpu.lock").stat().st_mode & 0o777 == 0o666


def test_a_resumed_search_beats_at_the_studys_heartbeat(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = Searcher(_search(url, tmp_path / "runs"), store)
        assert searcher.study.user_attrs["heartbeat_s"] == 10
        searcher.study.set_user_attr("heartbeat_s", 30)  # e.g. a study made by a later version
        searcher.claim.close()
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        Searcher(_search(url, tmp_path / "runs"), store).claim.close()
        assert store.optuna_storage.heartbeat_interval == 30
