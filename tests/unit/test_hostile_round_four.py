"""Issue 48, the sixth hostile probe's findings (benchmarks/results/cpu-hostile-probe-2026-11-28/
findings-6.md): each case fails before its fix and passes after."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from storage_samples import pin_document
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import SpecError, TrialInfrastructureError, UsageError
from budgettune.pinning.output import same_file
from budgettune.trial.launcher import launch_trial
from budgettune.trial.spec import KNOB_BY_NAME, TrialSpec
from budgettune.trial.trial_run import TrialRun

runner = CliRunner()
STUDY = Path(__file__).resolve().parents[2] / "studies" / "tiny-gpt-cpu.toml"


def test_p6_3_a_hard_link_of_the_database_is_the_same_file(tmp_path: Path) -> None:
    database, other = tmp_path / "s.db", tmp_path / "hard.db"
    database.write_bytes(b"SQLite format 3\x00")
    os.link(database, other)
    assert same_file(other, database)  # so --output hard.db --force is refused as the study's
    (tmp_path / "copy.db").write_bytes(database.read_bytes())
    assert not same_file(tmp_path / "copy.db", database)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_p6_6_a_fifo_planted_as_the_trial_log_is_one_line_not_a_hang(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / "trial.log")
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu", cache_root=None)
    with pytest.raises(TrialInfrastructureError, match="trial.log"):
        launch_trial(run, run_dir=folder, timeout_s=10)


def test_p6_7_the_written_pins_path_is_printed_on_one_line(tmp_path: Path) -> None:
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(pin_document(TrialSpec())), encoding="utf-8")
    out = tmp_path / "a\nb.json"
    result = runner.invoke(app, ["export", "--pin", str(pin), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.exists()
    assert result.stdout.strip().endswith("a\\nb.json")  # the newline as its escape
    assert len(result.stdout.strip().splitlines()) == 1


def test_p6_12_verify_refuses_an_empty_device(tmp_path: Path) -> None:
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(pin_document(TrialSpec())), encoding="utf-8")
    result = runner.invoke(
        app, ["verify", "--pin", str(pin), "--device", "", "--allow-other-workload"]
    )
    assert result.exit_code == 2, result.output
    assert "device must be" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["２", "+2", "1_6", "٤"])
def test_p6_13_a_micro_batch_is_ascii_digits_in_a_list_too(text: str) -> None:
    with pytest.raises(SpecError, match="is not an integer"):
        KNOB_BY_NAME["micro_batch"].parse(text, what="--micro-batches")
    assert KNOB_BY_NAME["micro_batch"].parse(" 8 ", what="--micro-batches") == 8


def test_p6_4_only_files_budgettune_wrote_are_replaced_without_force(tmp_path: Path) -> None:
    from budgettune.present.plot import check_plot_output

    notes = tmp_path / "notes.html"
    notes.write_text("<p>made with `budgettune show --plot`</p>", encoding="utf-8")
    with pytest.raises(UsageError, match="--force"):
        check_plot_output(str(notes))
    config = tmp_path / "app.json"  # a user's JSON with the two keys a pin has
    config.write_text('{"schema_version": 1, "spec": {}, "mine": true}', encoding="utf-8")
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(pin_document(TrialSpec())), encoding="utf-8")
    refused = runner.invoke(app, ["export", "--pin", str(pin), "--output", str(config)])
    assert refused.exit_code == 2 and "--force" in refused.stderr, refused.output
    assert "mine" in config.read_text(encoding="utf-8")
    again = runner.invoke(app, ["export", "--pin", str(pin), "--output", str(pin)])
    assert again.exit_code != 0  # the pin being read is never the output (as before)
    other = tmp_path / "other.json"
    other.write_text(pin.read_text(encoding="utf-8"), encoding="utf-8")  # a pin it wrote
    replaced = runner.invoke(app, ["export", "--pin", str(pin), "--output", str(other)])
    assert replaced.exit_code == 0, replaced.output


@pytest.mark.parametrize(
    "setting", ["max_split_size_mb:abc", "expandable_segments:maybe", "backend:magic"]
)
def test_p6_5_an_allocator_value_torch_refuses_is_refused_before_any_trial(
    setting: str, tmp_path: Path
) -> None:
    result = runner.invoke(
        app,
        [
            "search", str(STUDY), "--cuda-alloc-confs", f"default,{setting}",
            "--num-trials", "1", "--storage", str(tmp_path / "s.db"),
        ],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "torch takes" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize(
    "option, fragment",
    [
        ("unknown=1", "takes no option 'unknown'"),
        ("n_layers=x", "must be an integer"),
        ("seed=1e30", "option seed must be an integer"),
        ("tie_embeddings=maybe", "true or false"),
    ],
)
def test_p6_10_a_builtins_options_are_checked_before_any_trial(
    option: str, fragment: str, tmp_path: Path
) -> None:
    result = runner.invoke(
        app,
        [
            "search",
            str(STUDY),
            "-o",
            option,
            "--num-trials",
            "1",
            "--storage",
            str(tmp_path / "s.db"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()


def test_the_builtin_option_tables_are_the_builders_signatures() -> None:
    import importlib
    import inspect

    from budgettune.workload_builtins import BUILTINS

    for entry in BUILTINS:
        module, fn = entry.target.split(":")
        parameters = inspect.signature(getattr(importlib.import_module(module), fn)).parameters
        taken = {name: type(p.default) for name, p in parameters.items() if name != "device"}
        assert taken == dict(entry.options), entry.name


def test_p6_11_export_of_a_study_without_a_pin_is_bad_input_not_nothing_fits(
    tmp_path: Path,
) -> None:
    import optuna

    from budgettune import storage as storage_mod

    store = storage_mod.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    optuna.create_study(study_name="s", storage=store.optuna_storage)
    result = runner.invoke(
        app, ["export", "--storage", str(tmp_path / "s.db"), "--study", "s", "--output", "-"]
    )
    assert result.exit_code == 2, result.output
    assert "has no pinned config yet" in result.stderr


@pytest.mark.parametrize(
    "keywords, fragment",
    [
        ({"space": [1]}, "space takes a mapping"),
        ({"fix": "a=1"}, "fix takes a mapping"),
        ({"trial": 5}, "trial takes a mapping"),
        ({"runs_dir": 123}, "runs_dir takes a path"),
        ({"runs_dir": ""}, "runs_dir takes a path"),
        ({"options": {"n_layers": True}}, "must be an integer"),
    ],
)
def test_p6_8_p6_9_api_keywords_of_the_wrong_type_are_one_line(
    keywords: dict[str, object], fragment: str, tmp_path: Path
) -> None:
    import budgettune

    with pytest.raises(budgettune.BudgettuneError, match=fragment):
        budgettune.search(
            "builtin:tiny-gpt",
            max_mem="1GB",
            num_trials=0,
            storage_url=f"sqlite:///{tmp_path / 's.db'}",
            output=tmp_path / "pin.json",
            **keywords,  # type: ignore[arg-type]
        )
    assert not (tmp_path / "s.db").exists()


def test_p6_15_a_stored_pins_name_with_a_newline_keeps_the_error_on_one_line(
    tmp_path: Path,
) -> None:
    import optuna

    from budgettune import storage as storage_mod

    store = storage_mod.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    optuna.create_study(study_name="s", storage=store.optuna_storage)
    pin = {**pin_document(TrialSpec()), "study_name": "a\nb", "measured": "x"}  # refused
    store.record_pin(
        study_name="s", pin=pin, peak_bytes=1, step_time_ms=1.0, slowdown=None,
        limit_bytes=10**9, mem_metric="device",
    )  # fmt: skip
    result = runner.invoke(
        app, ["export", "--storage", str(tmp_path / "s.db"), "--study", "s", "--output", "-"]
    )
    assert result.exit_code == 2, result.output
    assert "'a\\nb'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_p6_16_a_spec_file_planted_as_a_folder_is_named_as_itself(tmp_path: Path) -> None:
    (tmp_path / "run" / "SPEC.json").mkdir(parents=True)
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu", cache_root=None)
    with pytest.raises(TrialInfrastructureError, match=r"run/SPEC.json \(Is a directory\)"):
        launch_trial(run, run_dir=tmp_path / "run", timeout_s=10)


def test_p6_11_an_empty_storage_url_is_bad_input() -> None:
    result = runner.invoke(app, ["show", "--storage", ""])
    assert result.exit_code == 2, result.output
    assert "storage URL is empty" in result.stderr
