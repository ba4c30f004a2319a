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
from budgettune.study.searcher import Searcher
from budgettune.study.study import SearchObserver
from budgettune.study.study_file import build_search_spec
from budgettune.trial.cpu_lock import CPU_LOCK_ENV, cpu_trial_lock
from budgettune.trial.spec import TrialSpec

# Eager trials: these tests are about teammates and the study (a compile is ~5 s a CPU trial).
FAST = TrialSpec(compile_mode="eager", warmup_steps=1, timed_steps=1)
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
            "fix": {"compile_mode": "eager"},
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
    # full block AC (the reference) is re-measured in the same rounds as budget 0.5, the
    # fastest trial that fits: the pin is the faster of the two fresh, or the lighter (full
    # AC) where the runs cannot tell them apart (issue 45: never a loser to a reference)
    budget, every = pin["spec"]["activation_memory_budget"], pin["spec"]["block_ac_every"]
    assert (budget, every) in ((0.5, 0), (1.0, 1))
    full_ac = pin["full_ac"]
    assert full_ac["runs"] >= 1 and full_ac["spec"]["block_ac_every"] == 1
    assert full_ac["slowdown"] == pin["measured"]["step_time_ms"] / full_ac["step_time_ms"] - 1
    report = study_report(url, "s")
    assert report.baseline_status == "oom"
    assert [r.slowdown_vs_full_ac is not None for r in report.rows] == [False, True, True]
    assert report.pin is not None and report.pin["full_ac"]["runs"] == full_ac["runs"]
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
    # made with the user's umask and never chmod-ed (issue 29): others lock it read-only
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "cpu.lock").stat().st_mode & 0o777 == 0o666 & ~umask


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


def test_a_cut_off_reverification_resumes_with_the_runs_it_stored(
    tmp_path: Path, monkeypatch
) -> None:
    """Issue 10: a search cut off while re-verifying (a 10-minute device command, a lost host)
    keeps every fresh run it finished, and the resumed search measures only the missing ones;
    runs from another torch version do not count."""
    import dataclasses

    from budgettune.study import searcher as searcher_mod
    from budgettune.study.fresh import FreshJob
    from budgettune.trial.results import Measurement, TrialOutcome, TrialResult

    def result(ms: float, torch_version: str = "2.13.0") -> TrialResult:
        figures = Measurement(
            peak_allocated_bytes=90_000_000, peak_reserved_bytes=95_000_000,
            peak_device_bytes=95_000_000, steady_bytes=1, phase_peak_bytes={"backward": 1},
            peak_phase="backward", step_time_ms=ms, step_time_p10_ms=ms, step_time_p90_ms=ms,
            compile_s=1.0, loss=1.0, grad_norm=1.0,
        )  # fmt: skip
        return TrialResult(
            outcome=TrialOutcome.OK, measurement=figures, device_name="cpu",
            torch_version=torch_version,
        )  # fmt: skip

    url = f"sqlite:///{tmp_path / 'bt.db'}"
    spec = FAST.replace(activation_memory_budget=0.5)
    study = optuna.create_study(study_name="s", storage=url)
    study.add_trial(_measured("budget-0.5", spec, peak=95_000_000, ms=20.0))
    launched: list[str] = []

    def fake_launcher(timeout_s: float, servers=None, cpu_shares=None, sharing=1):
        def launch(run, run_dir: Path) -> TrialResult:
            launched.append(run_dir.name)
            return result(21.0 + len(launched))

        return launch

    monkeypatch.setattr(searcher_mod, "launcher", fake_launcher)
    search = dataclasses.replace(_search(url, tmp_path / "runs"), reverify_runs=4)
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = Searcher(search, store, add_trials=False)
        try:
            searcher._store(0, "trial", spec, result(20.0))
            # the cut-off search had stored two runs, and one from another torch
            for ms, version in ((30.0, "2.13.0"), (31.0, "2.12.0"), (32.0, "2.13.0")):
                searcher._store(0, "reverify", spec, result(ms, version))
            job = FreshJob(spec=spec, number=0, run_name="reverify-0000", phase="re-verifying")
            (runs,) = searcher.fresh_batch([job])
            # two kept, two measured now (in the next run folders), each stored as it came
            assert [r.measurement.step_time_ms for r in runs if r.measurement] == [
                30.0, 32.0, 22.0, 23.0,
            ]  # fmt: skip
            assert launched == ["reverify-0000-2", "reverify-0000-3"]
            stored = store.measurements("s", kind="reverify")
            assert [m.step_time_ms for m in stored] == [30.0, 31.0, 32.0, 22.0, 23.0]
            # resumed again: nothing is missing, nothing runs
            (again,) = searcher.fresh_batch([job])
            assert len(again) == 4 and len(launched) == 2
            # another configuration of the same trial number shares nothing
            other = dataclasses.replace(job, spec=spec.replace(block_ac_every=1))
            (fresh,) = searcher.fresh_batch([other])
            assert len(fresh) == 4 and len(launched) == 6
        finally:
            searcher.claim.close()


def test_a_value_excluded_after_crashes_leaves_its_knob_drawable(tmp_path: Path) -> None:
    """After fused crashed twice (excluded), later trials still draw the optimizer from the
    two values left: Optuna refuses a categorical whose choices change within a study, which
    failed every later trial that drew the knob (H100, 2026-11-26: op_offload on torch 2.11)."""
    from budgettune.storage.user_attrs import EXCLUDED_ATTR

    url = f"sqlite:///{tmp_path / 'bt.db'}"
    search = build_search_spec(
        {
            "workload": "builtin:tiny-gpt", "max_mem": "500MB", "study": "s", "storage": url,
            "runs_dir": str(tmp_path / "runs"), "trials": 4,
            "space": {"backend": "aot_eager_decomp_partition", "ac_every": [0],
                      "optimizer_impls": ["as_written", "foreach", "fused"]},
            "fix": {"compile_mode": "eager"},
        },
        default_device="cpu",
    )  # fmt: skip
    with storage.open_storage(url, heartbeat_interval_s=10) as store:
        searcher = Searcher(search, store)
        searcher.claim.close()
        study = searcher.study
        drawn_before = set()
        for _ in range(8):  # the baselines, then the sampler's draws of all three
            trial = study.ask()
            drawn_before.add(searcher.spec_for(trial).optimizer_impl)
            study.tell(trial, 1.0)
        study.set_user_attr(EXCLUDED_ATTR, [{"knob": "optimizer_impl", "value": "fused"}])
        drawn_after = set()
        for _ in range(12):
            trial = study.ask()
            drawn_after.add(searcher.spec_for(trial).optimizer_impl)
            study.tell(trial, 1.0)
    assert "fused" in drawn_before
    assert drawn_after == {"as_written", "foreach"}
