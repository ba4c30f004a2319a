"""Issue 48, the fourth hostile probe (benchmarks/results/cpu-hostile-probe-2026-11-28/, P1-P15):
each case it broke, as a test that failed before the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import budgettune
from budgettune.cli import app
from budgettune.errors import BudgettuneError, SpecError, StorageError, UsageError

runner = CliRunner()


def test_p1_a_sqlite_uri_filename_is_refused_so_no_output_check_is_dodged(tmp_path: Path) -> None:
    from budgettune.storage.engine import normalize_url

    database = tmp_path / "base.db"
    database.write_bytes(b"SQLite format 3\x00" + bytes(100))
    before = database.read_bytes()
    url = f"sqlite:///file:{database}?uri=true"
    with pytest.raises(StorageError, match="URI filenames"):
        normalize_url(url)
    result = runner.invoke(
        app, ["export", "--storage-url", url, "--output", str(database), "--force"]
    )
    assert result.exit_code != 0 and "URI filenames" in result.stderr
    assert database.read_bytes() == before  # the study's database is never the pin


def test_p2_a_trial_folder_that_is_a_link_is_never_written_through(tmp_path: Path) -> None:
    from budgettune.errors import TrialInfrastructureError
    from budgettune.trial.launcher import launch_trial
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun

    users = tmp_path / "userdir"
    users.mkdir()
    for name in ("SPEC.json", "RESULT.json", "trial.log"):
        (users / name).write_text(f"the user's {name}")
    planted = tmp_path / "runs" / "study" / "trial-0000"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(users)
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu")
    with pytest.raises(TrialInfrastructureError, match="a link"):
        launch_trial(run, run_dir=planted, timeout_s=60)
    for name in ("SPEC.json", "RESULT.json", "trial.log"):
        assert (users / name).read_text() == f"the user's {name}"


@pytest.mark.parametrize("ranks", [10**9, 4097, (os.cpu_count() or 1) + 1])
def test_p3_rank_counts_are_bounded_by_the_limit_and_the_hosts_cores(ranks: int) -> None:
    from budgettune.trial.spec import TrialSpec
    from budgettune.trial.trial_run import TrialRun

    with pytest.raises(SpecError, match="nproc_per_node must be|CPU ranks on a host of"):
        TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu", nproc_per_node=ranks)


@pytest.mark.parametrize(
    "setting",
    ["max_split_size_mb:abc", "garbage_collection_threshold:5", "expandable_segments:maybe"],
)
def test_p5_an_allocator_value_torch_refuses_is_one_line_and_leaves_the_variable(
    setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch  # noqa: F401 - the README's torch-first order: torch parses the value

    from budgettune.trial.allocator import ENV_VAR, apply_allocator_settings

    monkeypatch.setenv(ENV_VAR, "")
    # refused before torch sees it since the sixth probe (P6-5), torch's own refusal before
    with pytest.raises(SpecError, match=f"cuda_alloc_conf:? '{setting}': torch (refuses|takes)"):
        apply_allocator_settings(setting)
    assert os.environ[ENV_VAR] == ""


def test_p6_a_lone_surrogate_prints_as_its_escape() -> None:
    from budgettune.errors import terminal_safe

    assert terminal_safe("note \ud800 \x1b[2J") == "note \\ud800 \\x1b[2J"


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"output": 123}, "output takes a path"),
        ({"output": "a\x00b.json"}, "output takes a path"),
        ({"study_file": 123}, "study_file takes a path"),
        ({"force": "yes"}, "force takes True or False"),
        ({"progress": "no"}, "progress takes True or False"),
        ({"max_mem": b"200MB"}, "max_mem takes"),
        ({"options": {"n_layers": object()}}, "workload_options must be"),
        ({"output": "sub/"}, "names a folder"),
    ],
)
def test_p8_p15_api_arguments_of_the_wrong_type_are_one_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, object], said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    values: dict = {"max_mem": "200MB", "device": "cpu", **arguments}
    max_mem = values.pop("max_mem")
    with pytest.raises(BudgettuneError, match=said) as caught:
        budgettune.search("builtin:tiny-gpt", max_mem, **values)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # no study made (the object() option made one)


def test_p9_verify_reverify_runs_is_bounded(tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(tmp_path / "pin.json"), "--runs", str(10**20)])
    assert result.exit_code == 2 and "--reverify-runs must be at most 100" in result.stderr


@pytest.mark.parametrize("device", ["", "cpu\n"])
def test_p10_p11_an_empty_or_newline_device_is_refused(device: str) -> None:
    from budgettune.study.study_file import build_search_spec

    with pytest.raises(UsageError, match="--device must be cpu, cuda or cuda:N"):
        build_search_spec({"max_mem": "1GB", "device": device}, default_device="cpu")


def test_p12_an_output_with_a_trailing_slash_names_a_folder(tmp_path: Path) -> None:
    from budgettune.pinning import check_pin_output

    with pytest.raises(UsageError, match="names a folder"):
        check_pin_output(f"{tmp_path}/sub/")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_p13_db_upgrade_refuses_an_in_memory_database(url: str) -> None:
    result = runner.invoke(app, ["db", "upgrade", "--storage-url", url])
    assert result.exit_code == 2 and "in-memory database" in result.stderr


def test_p14_an_error_message_is_bounded_for_the_api_too() -> None:
    message = str(UsageError("x" * 5_000_000))
    assert len(message) < 4_100 and "characters left out" in message


def test_a_builtin_workload_too_large_for_the_host_is_refused_before_it_is_built() -> None:
    """P4: ``-o n_layers=100000000`` built blocks until memory ran out; now the sizes are
    bounded and, on the CPU, the parameters are counted on the meta device first."""
    import torch

    from budgettune.errors import WorkloadError
    from budgettune.workload import BUILTIN_MAX_LAYERS, load_workload

    cpu = torch.device("cpu")
    for options, says in (
        ({"n_layers": 10**8}, f"option n_layers must be from 1 to {BUILTIN_MAX_LAYERS}"),
        ({"batch_size": 0}, "option batch_size must be from 1 to"),
        ({"n_layers": 1024, "d_model": 8192, "n_heads": 8}, "more than this host's"),
    ):
        with pytest.raises(WorkloadError, match=says):
            load_workload("builtin:tiny-gpt", cpu, options)
    assert load_workload("builtin:tiny-gpt", cpu, {"n_layers": 2}).model is not None


def test_a_builtin_size_out_of_bounds_is_refused_by_the_parent(tmp_path: Path) -> None:
    """The fifth probe (P5-4): refused in the trial child it was "trial crashed", exit 1,
    after seconds; the parent refuses it first, exit 2, before any trial or study."""
    from budgettune.errors import WorkloadError
    from budgettune.workload import check_reference

    for options, says in (({"n_layers": 0}, "from 1 to 1024"), ({"n_layers": 1e3}, "an integer")):
        with pytest.raises(WorkloadError, match=says):
            check_reference("builtin:tiny-gpt", options)
    check_reference("builtin:llama", {"rope_theta": 10000.0, "n_layers": 2})  # a float option
    db = tmp_path / "b.db"
    for command in (["trial"], ["search", "--max-mem", "1GB", "--storage-url", str(db)]):
        result = runner.invoke(app, [*command, "-w", "builtin:tiny-gpt", "--device", "cpu",
                                     "-o", "n_layers=0"])  # fmt: skip
        assert result.exit_code == 2 and "n_layers must be from 1" in result.stderr, result.output
    assert not db.exists()
