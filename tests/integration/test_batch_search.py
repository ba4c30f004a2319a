"""Issue 46: the micro-batch in the search. Micro-batches 2, 4, 8 at a global batch of 16 on
the tiny GPT: every trial's step is one optimizer step of 16 rows (its micro-batch
accumulated), the batch finder's points come first, and the pin's micro-batch and accumulation
are in the pin file, in `PinnedConfig` and in a `Trainer` that applies the pin."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.pinning import StalePinWarning, load_pinned
from budgettune.present.report import study_report


def _tiny_search(tmp_path: Path, *args: str) -> Any:
    """A 4-trial search of the one-layer tiny GPT into ``tmp_path`` (bt.db, pin.json), one
    fresh run of the fastest, with ``args`` (the limit and the micro-batches)."""
    return CliRunner().invoke(
        app,
        [
            "search", "-w", "builtin:tiny-gpt", "--option", "n_layers=1", *args,
            "--num-trials", "4", "--compile-backend", "aot_eager_decomp_partition",
            "--warmup-steps", "1", "--timed-steps", "1", "--top-k", "1",
            "--reverify-runs", "1", "--storage-url", f"sqlite:///{tmp_path / 'bt.db'}",
            "--runs-dir", str(tmp_path / "runs"), "--output", str(tmp_path / "pin.json"),
        ],
    )  # fmt: skip


def test_a_search_over_micro_batches_pins_one_and_a_trainer_runs_it(tmp_path: Path) -> None:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from budgettune.integrations.transformers import PinCallback

    db, pin_path = tmp_path / "bt.db", tmp_path / "pin.json"
    result = _tiny_search(
        tmp_path, "--max-mem", "115MB", "--micro-batches", "2,4,8,3", "--global-batch", "16"
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    assert study.metric_names == ["step time (ms)"]  # the dashboard's name for the objective
    trials = study.trials
    specs = [t.user_attrs["spec"] for t in trials if "spec" in t.user_attrs]
    # 3 does not divide 16: never tried; every trial is 16 rows a step
    assert {s["micro_batch"] for s in specs} <= {2, 4, 8}
    assert all(s["micro_batch"] * s["accum_steps"] == 16 for s in specs)
    # the baselines at the largest micro-batch, then the batch finder's walk down: budget 1.0
    # at 8 is over the limit, so 4 is tried next
    labels = [t.user_attrs.get("baseline") for t in trials]
    assert labels[:4] == ["unconstrained", "block-ac-every-1", "budget-0.5", "batch-none-4"]
    assert "samples/s" in result.stderr  # the progress lines

    document = json.loads(pin_path.read_text())
    micro, accum = document["spec"]["micro_batch"], document["spec"]["accum_steps"]
    assert micro in (2, 4, 8) and micro * accum == 16
    pinned = load_pinned(pin_path, warn=False, apply_allocator=False)
    assert (pinned.micro_batch, pinned.accum_steps, pinned.global_batch) == (micro, accum, 16)
    assert pinned.batch_arguments() == {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
    }

    rows_seen: list[int] = []
    optimizer_steps: list[int] = []

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            optimizer_steps.append(len(rows_seen))

    def trainer(**batch: int) -> Trainer:
        config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
        model = GPT2LMHeadModel(config)
        model.register_forward_pre_hook(
            lambda module, args, kwargs: rows_seen.append(kwargs["input_ids"].shape[0]),
            with_kwargs=True,
        )
        tokens = torch.randint(0, config.vocab_size, (64, 16))
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=2, save_strategy="no",
            report_to="none", use_cpu=True, disable_tqdm=True, **batch,
        )  # fmt: skip
        data = [{"input_ids": row, "labels": row} for row in tokens]
        return Trainer(
            model=model, args=args, train_dataset=data, callbacks=[PinCallback(pinned), Count()]
        )

    def batch_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
        return [
            str(w.message)
            for w in caught
            if issubclass(w.category, StalePinWarning)
            and "TrainingArguments run" in str(w.message)
        ]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (the pin is the tiny GPT's: the model's size differs)
        trainer(**pinned.batch_arguments()).train()
    assert batch_warnings(caught) == []
    assert set(rows_seen) == {micro}  # every forward a micro-batch of the pin's
    assert optimizer_steps == [accum, 2 * accum]  # the pin's accumulation per optimizer step

    rows_seen.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(per_device_train_batch_size=16, gradient_accumulation_steps=1)
    said = batch_warnings(caught)
    assert len(said) == 1 and "per_device_train_batch_size=16" in said[0], said


def test_without_a_global_batch_each_micro_batch_steps_on_its_own_rows_ranked_per_row(
    tmp_path: Path,
) -> None:
    # issue 46: "Without a global batch the objective is samples per second at each trial's
    # own micro-batch" (it was refused in one line before)
    db, pin_path = tmp_path / "bt.db", tmp_path / "pin.json"
    result = _tiny_search(
        tmp_path, "--option", "batch_size=2", "--max-mem", "1GB", "--micro-batches", "2,4"
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    # the workload's own micro-batch (2) is the baselines', and every step time is scaled to
    # its rows; the batch finder's walk goes up to 4 while it fits
    assert study.metric_names == ["step time per 2 rows (ms)"]
    done = [t for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert done
    sizes = set()
    for trial in done:  # one pass a step at its own rows; its value scaled to 2 rows
        spec = trial.user_attrs["spec"]
        assert spec["micro_batch"] in (2, 4) and spec["accum_steps"] == 1
        step_ms = trial.user_attrs["step_time_ms"]
        assert trial.value == pytest.approx(step_ms * 2 / spec["micro_batch"])
        sizes.add(spec["micro_batch"])
    assert sizes == {2, 4}, sizes  # both sizes measured, so the scaling was exercised
    # show's "vs base", Pareto front and best feasible compare time per row too
    report = study_report(f"sqlite:///{db}", None)
    assert report.ranking_rows == 2
    base = next(r for r in report.rows if r.baseline == "unconstrained")
    assert base.step_time_ms is not None
    for row in report.rows:
        if row.step_time_ms is not None and row.slowdown is not None:
            rows_of = 4 if "micro-batch 4" in row.config else 2
            per_row = row.step_time_ms / rows_of / (base.step_time_ms / 2)
            assert row.slowdown == pytest.approx(per_row - 1.0)
    feasible = [r.ranked_ms for r in report.rows if r.feasible and r.ranked_ms is not None]
    assert report.best is not None and report.best.ranked_ms == min(feasible)
    shown = CliRunner().invoke(app, ["show", "--storage", str(db)])
    assert "time per row (samples/s)" in shown.stdout
    from budgettune import storage as storage_mod
    from budgettune.study.publish import study_views

    _, figure, _, _ = study_views(storage_mod.open_storage(f"sqlite:///{db}"), study.study_name)
    assert figure.layout.yaxis.title.text == "step time per 2 rows (ms)"  # the dashboard's too
    drawn = [round(y, 6) for trace in figure.data for y in (trace.y or ())]
    assert all(round(r.ranked_ms, 6) in drawn for r in report.rows if r.feasible and r.ranked_ms)
    pinned = load_pinned(pin_path, warn=False, apply_allocator=False)
    assert pinned.accum_steps == 1 and pinned.micro_batch in (2, 4)
    assert pinned.global_batch == pinned.micro_batch
    assert pinned.batch_arguments() == {
        "per_device_train_batch_size": pinned.micro_batch,
        "gradient_accumulation_steps": 1,
    }


def test_a_study_resumed_with_fewer_micro_batches_runs_its_queued_baselines(
    tmp_path: Path,
) -> None:
    # issue 48's P6-1: the baselines queued at micro-batch 16 (the largest of 1..16) met a
    # resumed search over 2,4; Optuna refused the queued value ("'16' not in (2, 4)"), a
    # traceback and a failed trial
    def search(sizes: str) -> None:
        result = CliRunner().invoke(
            app,
            [
                "search", "-w", "builtin:tiny-gpt", "-o", "n_layers=1", "--device", "cpu",
                "--compile-backend", "aot_eager_decomp_partition", "--warmup-steps", "1",
                "--timed-steps", "1", "--max-mem", "1GB", "--top-k", "1",
                "--reverify-runs", "1", "--storage", str(tmp_path / "mb.db"),
                "--global-batch", "16", "--output", str(tmp_path / "pin.json"),
                "--runs-dir", str(tmp_path / "runs"), "--num-trials", "1",
                "--micro-batches", sizes,
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output

    search("1..16")
    search("2,4")
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'mb.db'}")
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.FAIL not in states
    queued = study.trials[1]  # the full-AC baseline, queued by the first search at 16 rows
    assert queued.state is optuna.trial.TrialState.COMPLETE
    assert queued.user_attrs["spec"]["micro_batch"] == 16  # measured as it was queued
