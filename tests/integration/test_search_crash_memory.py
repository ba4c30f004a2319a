"""A search whose block AC crashes (issue 9): it spends at most 2 trials on it and says so."""

from __future__ import annotations

from pathlib import Path

import optuna
from typer.testing import CliRunner, Result

from budgettune import storage
from budgettune.cli import app
from budgettune.study.searcher import Searcher
from budgettune.study.study import SearchObserver
from budgettune.study.study_file import build_search_spec

FIXTURES = Path(__file__).parents[1] / "fixtures" / "faulty_workloads.py"
runner = CliRunner()


def _search(workload: str, db: str, *options: str) -> Result:
    """A small CPU search of a fixture workload in study ``s`` of ``db``, one worker."""
    return runner.invoke(
        app,
        [
            "search", "--workload", f"{FIXTURES}:{workload}", "--device", "cpu",
            "--max-mem", "1GB", "--storage", db, "--study", "s", "--solvers", "dp",
            "--remove-ops", "", "--add-ops", "", "--backend", "aot_eager_decomp_partition",
            "--warmup-steps", "1", "--timed-steps", "1", "--top-k", "1", "--reverify", "1",
            # eager: what these tests are about (crashes, exclusions, the probe's retry) does
            # not depend on the partitioner, and a compile costs ~5 s of every trial
            "--fix", "compile_mode=eager", "--seed", "3", *options,
        ],
        catch_exceptions=False,
    )  # fmt: skip


def test_block_ac_that_crashes_is_excluded_after_its_baseline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'bt.db'}"
    result = _search(
        "crashes_under_block_ac", db, "--trials", "7", "--ac-every", "0,1,2",
        "--ac-policies", "full,op", "--optimizer-impls", "as_written",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "block AC excluded: its baseline crashed" in result.output
    assert result.output.count("block AC excluded") == 1  # said once
    trials = optuna.load_study(study_name="s", storage=db).get_trials(deepcopy=False)
    ran = [t for t in trials if "spec" in t.user_attrs]
    assert len(ran) == 7
    crashed = [t for t in ran if t.user_attrs["outcome"] == "crashed"]
    assert 1 <= len(crashed) <= 2
    assert all(t.user_attrs["spec"]["block_ac_every"] > 0 for t in crashed)
    # Everything after the exclusion ran without block AC.
    after = [t for t in ran if t.number > max(c.number for c in crashed)]
    assert after and all(t.user_attrs["spec"]["block_ac_every"] == 0 for t in after)
    shown = runner.invoke(app, ["show", "--storage", db, "--study", "s"])
    assert shown.exit_code == 0, shown.output
    assert "excluded after crashes: block AC excluded: its baseline crashed" in shown.output
    assert "The expanded size of the tensor" in shown.output


def test_a_high_budget_probe_the_workload_cannot_take_is_measured_again_as_given(
    tmp_path: Path, monkeypatch
) -> None:
    # The probe takes optimizer_impl "fused"; RMSprop has no such flag, so it crashes. The
    # study must still measure budget 0.8, with the optimizer as written. A 10-trial study (the
    # probe's threshold) run for its opening only: the three baselines, the probe, the settle
    # probe of the optimizer (which crashes alike) and the retry.
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'bt.db'}"
    search = build_search_spec(
        {
            "workload": f"{FIXTURES}:rmsprop", "device": "cpu", "max_mem": "1GB",
            "storage": url, "study": "s", "trials": 10, "sampler_seed": 3,
            "space": {"solvers": ["dp"], "remove_ops": [], "add_ops": [], "ac_every": [0, 1],
                      "ac_policies": ["full"], "backend": "aot_eager_decomp_partition"},
            "fix": {"compile_mode": "eager"},
            "trial": {"warmup_steps": 1, "timed_steps": 1},
        },
        default_device="cpu",
    )  # fmt: skip
    notices: list[str] = []

    class Notices(SearchObserver):
        def notice(self, text: str) -> None:
            notices.append(text)

    with storage.open_storage(url) as store:
        searcher = Searcher(search, store, Notices())
        try:
            searcher.run_trials(max_trials=6)
        finally:
            searcher.claim.close()
    retried = [n for n in notices if "measuring it again as given" in n]
    assert len(retried) == 1 and retried[0].startswith("the budget-0.8 probe crashed"), notices
    study = optuna.load_study(study_name="s", storage=url)
    trials = study.get_trials(deepcopy=False)
    by_label = {t.user_attrs.get("baseline"): t for t in trials if t.user_attrs.get("baseline")}
    probe, retry = by_label["budget-0.8"], by_label["budget-0.8-as-given"]
    assert probe.user_attrs["outcome"] == "crashed"
    assert "takes no 'fused' flag" in probe.user_attrs["error"]
    assert retry.user_attrs["outcome"] == "ok"
    assert retry.user_attrs["spec"]["activation_memory_budget"] == 0.8
    assert retry.user_attrs["spec"]["optimizer_impl"] == "as_written"
    # queued at the crash: next after the opening's trials queued before it, ahead of the
    # sampler's (one worker)
    between = [t for t in trials if probe.number < t.number < retry.number]
    assert all(t.user_attrs.get("baseline") for t in between), between
    assert study.user_attrs["target_trials"] == 10  # the retry is one of the 10, not an 11th
