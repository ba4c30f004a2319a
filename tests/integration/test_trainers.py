"""A pin in the trainers people use (issue 32): a transformers `Trainer` and a Lightning
`Trainer` train a tiny Llama for a few steps with the pin applied by one callback, and a
`Trainer`'s model and first batch become a workload to search.

The trainers are the examples' (`examples/hf_trainer.py`, `examples/lightning_with_pin.py`),
run here on CPU with the codegen-free backend.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import sys
import types
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from budgettune.errors import PinnedConfigError
from budgettune.pinning import PinnedConfig, StalePinWarning, parse_pin, write_pin
from budgettune.trial import allocator
from budgettune.trial.block_ac import is_checkpointed
from budgettune.trial.recompute import prepare
from budgettune.trial.scoped_forward import scoped_forward_of
from budgettune.trial.spec import EXPANDABLE, TrialSpec
from budgettune.workload import check_reference, load_workload

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC = TrialSpec(
    activation_memory_budget=0.5,
    compile_backend="aot_eager_decomp_partition",
    block_ac_every=1,
    optimizer_impl="foreach",
)


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc(spec: TrialSpec = SPEC, **extra: object) -> dict:
    return {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "workload": "examples/hf_trainer.py:build",
        "limit_bytes": 1_000_000_000,
        "mem_metric": "device",
        "model_changes": ["use_cache=False"],
        "fingerprint": {
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda or "",
            "device_name": "cpu",
            "workload": {},
        },
        **extra,
    }


def _pin(tmp_path: Path, spec: TrialSpec = SPEC) -> Path:
    return write_pin(tmp_path / "best.json", _doc(spec))


def _the_pin_is_applied(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    assert model.config.use_cache is False  # type: ignore[union-attr]
    layers = model.model.layers  # type: ignore[union-attr]
    assert len(layers) == 2 and all(is_checkpointed(block) for block in layers)
    forward = scoped_forward_of(model)
    assert forward is not None and forward.calls == 3  # every step ran the compiled forward
    assert optimizer.defaults["foreach"] is True and optimizer.defaults["fused"] is False
    # the partitioner settings were scoped to the model's calls, never left set
    assert torch._functorch.config.activation_memory_budget == 1.0


def test_a_transformers_trainer_trains_with_the_pin_applied(tmp_path: Path) -> None:
    from budgettune.integrations.trainer_pin import torch_optimizer

    example = _example("hf_trainer")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePinWarning)
        trainer = example.train(str(_pin(tmp_path)), str(tmp_path / "out"), steps=3)
    model, optimizer = trainer.model, torch_optimizer(trainer.optimizer)
    assert type(model).__name__ == "LlamaForCausalLM"  # the Trainer still holds its own model
    assert trainer.args.optim.startswith("adamw_torch_fused")  # the Trainer built it fused
    _the_pin_is_applied(model, optimizer)
    # the Trainer read forward's parameters to drop the dataset's `row` column
    assert "input_ids" in inspect.signature(model.forward).parameters
    # the scheduler still drives the optimizer that steps: its linear decay reached 0
    assert torch_optimizer(trainer.lr_scheduler.optimizer) is optimizer
    assert optimizer.param_groups[0]["lr"] == 0.0
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("changes", [["use_cache=False"], []])
def test_a_trainers_kv_cache_follows_the_pins_model_changes_alone(
    tmp_path: Path, changes: list[str]
) -> None:
    """A budget-only pin (no block AC, which turns the cache off by itself): the cache is off
    in the Trainer's model exactly when the pin records that the trial turned it off. The
    Trainer sets ``config.use_cache`` from its arguments after its callbacks' ``on_init_end``
    (transformers 5.2x); the test sets it on there, as ``TrainingArguments(use_cache=True)``
    would, and the callback turns it off again at train begin."""
    from budgettune.integrations.transformers import PinCallback

    example = _example("hf_trainer")
    spec = TrialSpec(
        activation_memory_budget=0.5, compile_backend="aot_eager_decomp_partition",
        optimizer_impl="foreach",
    )  # fmt: skip
    pin = write_pin(tmp_path / "best.json", _doc(spec, model_changes=changes))
    trainer = example.make_trainer(str(tmp_path / "out"), callbacks=[PinCallback(pin)], steps=1)
    trainer.model.config.use_cache = True
    trainer.train()
    layers = trainer.model.model.layers
    assert not any(is_checkpointed(block) for block in layers)
    assert trainer.model.config.use_cache is (not changes)


def test_a_lightning_trainer_fits_with_the_pin_applied(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    example = _example("lightning_with_pin")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePinWarning)
        trainer, module = example.train(str(_pin(tmp_path)), steps=3)
    _the_pin_is_applied(module.model, trainer.optimizers[0])
    assert len(module.losses) == 3 and all(math.isfinite(loss) for loss in module.losses)


def test_lightning_warns_when_it_accumulates_otherwise_than_the_pin(tmp_path: Path) -> None:
    """Issue 46: a pin measured with 2 micro-batches accumulated per optimizer step, in a
    Trainer that accumulates none: the step the job runs is not the one measured."""
    pytest.importorskip("lightning")
    example = _example("lightning_with_pin")
    pin = _pin(tmp_path, SPEC.replace(micro_batch=4, accum_steps=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        example.train(str(pin), steps=1)
    said = [str(w.message) for w in caught if issubclass(w.category, StalePinWarning)]
    assert any("accumulate_grad_batches=2" in line and "of 4 rows" in line for line in said)


def test_lightning_warns_when_training_step_skips_the_compiled_forward(tmp_path: Path) -> None:
    """Without ``module="model"`` the LightningModule's own forward is compiled, which the
    example's training_step never calls: the first step says so."""
    lightning = pytest.importorskip("lightning.pytorch")
    from budgettune.integrations.lightning import PinCallback

    example = _example("lightning_with_pin")
    module = example.TinyLlama()
    trainer = lightning.Trainer(
        accelerator="cpu",
        max_steps=1,
        callbacks=[PinCallback(str(_pin(tmp_path)))],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(torch.randint(0, 256, (4, 16)), batch_size=4)
    with pytest.warns(StalePinWarning, match="module='NAME'"):
        trainer.fit(module, loader)


def test_a_trainers_model_and_first_batch_become_a_workload(tmp_path: Path) -> None:
    example = _example("hf_trainer")
    reference = example.write(str(tmp_path / "workload"))
    assert reference == f"{tmp_path / 'workload' / 'build.py'}:build"
    check_reference(reference)
    workload = load_workload(reference, torch.device("cpu"), {})
    trainer_model = example.make_trainer(str(tmp_path / "out")).model
    assert type(workload.model) is type(trainer_model)
    count = sum(p.numel() for p in workload.model.parameters())
    assert count == sum(p.numel() for p in trainer_model.parameters())
    # the Trainer's batch: its collator stacked 4 rows and dropped the `row` column
    assert {k: tuple(v.shape) for k, v in workload.batch.items()} == {
        "input_ids": (4, 32),
        "labels": (4, 32),
    }
    assert workload.optimizer is not None
    optimizer = workload.optimizer(workload.model.parameters())
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["fused"] is True and optimizer.defaults["lr"] == 1e-3
    step = prepare(
        workload, TrialSpec(compile_mode="eager", block_ac_every=1), torch.device("cpu")
    )
    assert math.isfinite(step.run_step().item())
    assert "gradient clipping (max_grad_norm=1.0)" in Path(reference.split(":")[0]).read_text()


def _fake_torch() -> types.SimpleNamespace:
    """torch's allocator entry points, as `apply_allocator_settings` reads them (CUDA holding
    no memory): the only way to watch the setting arrive without changing this process's."""
    state = {"settings": ""}
    c_module = types.SimpleNamespace(
        _accelerator_getAllocatorSettings=lambda: state["settings"],
        _accelerator_setAllocatorSettings=lambda text: state.update(settings=text),
    )
    cuda = types.SimpleNamespace(is_initialized=lambda: False)
    return types.SimpleNamespace(__version__="fake", _C=c_module, cuda=cuda, state=state)


@pytest.mark.parametrize("integration", ["transformers", "lightning"])
def test_a_callback_gives_the_allocator_setting_when_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, integration: str
) -> None:
    pytest.importorskip("lightning" if integration == "lightning" else "transformers")
    callbacks = importlib.import_module(f"budgettune.integrations.{integration}")
    spec = TrialSpec(compile_mode="eager", cuda_alloc_conf=EXPANDABLE)
    pinned = parse_pin(_doc(spec), source="pin.json")
    fake = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(allocator, "_APPLIED", set())
    monkeypatch.delenv(allocator.ENV_VAR, raising=False)
    callback = callbacks.PinCallback(pinned)
    assert callback.pin.allocator.how == "setter"
    assert fake.state["settings"] == EXPANDABLE
    assert allocator.os.environ[allocator.ENV_VAR] == EXPANDABLE


def test_a_sharded_pin_is_not_applied_in_place() -> None:
    pinned: PinnedConfig = parse_pin(_doc(world_size=2), source="sharded.json")
    with pytest.raises(PinnedConfigError, match="under torchrun, not in place"):
        pinned.compile(torch.nn.Linear(2, 2), in_place=True)


def test_budgettune_search_takes_a_trainer_and_pins_its_model_and_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import budgettune

    monkeypatch.chdir(tmp_path)
    trainer = _example("hf_trainer").make_trainer(str(tmp_path / "out"))
    pinned = budgettune.search(
        trainer, "1GB", device="cpu", storage_url=f"sqlite:///{tmp_path / 'bt.db'}",
        num_trials=1, top_k=1, reverify_runs=1, progress=False,
        workload_dir=tmp_path / "trainer-workload",
        space={"compile_backend": "aot_eager_decomp_partition"}, fix={"compile_mode": "eager"},
        trial={"warmup_steps": 1, "timed_steps": 1},
    )  # fmt: skip
    assert isinstance(pinned, PinnedConfig)
    written = json.loads((tmp_path / "budgettune-pin.json").read_text())
    assert written["workload"] == f"{tmp_path / 'trainer-workload' / 'build.py'}:build"
    assert written["spec"] == pinned.spec.to_json_dict()


def test_a_trainer_job_peaks_where_the_pin_searched_from_its_trainer_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: the searched step is the job's step. A `Trainer` of a GPT-2 from its config,
    dropout as the config has it (0.1), is searched through `write_workload`; the same
    `Trainer` with `PinCallback` then measures its third step with `measure_step` (the
    Trainer zeroes the gradients at the end of its step; test_step_meter covers the start).
    The workload used to set dropout to 0: the job peaked 14 % over the pin, unwarned."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    import budgettune
    from budgettune.integrations.transformers import PinCallback

    monkeypatch.chdir(tmp_path)

    def make_trainer(callbacks: list | None = None, steps: int = 3) -> Trainer:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
        assert config.resid_pdrop == 0.1  # the default dropout
        torch.manual_seed(0)
        tokens = torch.randint(0, config.vocab_size, (16, 32))
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
            disable_tqdm=True,
        )  # fmt: skip
        data = [{"input_ids": row, "labels": row} for row in tokens]
        return Trainer(
            model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=callbacks
        )

    pinned = budgettune.search(
        make_trainer(), "1GB", device="cpu", storage_url=f"sqlite:///{tmp_path / 'bt.db'}",
        num_trials=2, top_k=1, reverify_runs=1, progress=False,
        workload_dir=tmp_path / "trainer-workload",
        space={"compile_backend": "aot_eager_decomp_partition"},
        trial={"warmup_steps": 2, "timed_steps": 1},
    )  # fmt: skip
    assert pinned.pin.dropout == ("Dropout p=0.1",)  # the trial ran the Trainer's dropout

    class ThirdStep(TrainerCallback):
        meter: Any = None
        trainer: Any = None

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            if state.global_step == 2:
                model, optimizer = self.trainer.model, self.trainer.optimizer
                self.meter = pinned.measure_step(model=model, optimizer=optimizer)
                self.meter.__enter__()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            if self.meter is not None and self.meter.result is None:
                self.meter.__exit__(None, None, None)

    third = ThirdStep()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePinWarning)  # the job runs what the pin measured
        trainer = make_trainer(callbacks=[PinCallback(pinned), third])
        third.trainer = trainer
        trainer.train()
    check = third.meter.result
    assert check is not None and check.relative_error is not None
    assert abs(check.relative_error) <= 0.03, check.summary()


def test_write_workload_never_replaces_a_users_files_or_writes_through_a_link(
    tmp_path: Path,
) -> None:
    """Issue 48: `write_workload` replaced a user's own ``build.py`` and ``config.json`` and
    wrote through a ``trainer.json`` link; now it refuses in one line, the files untouched, and
    writes again only into a folder it wrote."""
    from budgettune.errors import UsageError
    from budgettune.integrations.transformers import write_workload

    trainer = _example("hf_trainer").make_trainer(str(tmp_path / "out"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "build.py").write_text("def build(device): ...  # the user's own\n")
    with pytest.raises(UsageError, match="did not write"):
        write_workload(trainer, mine)
    assert (mine / "build.py").read_text().endswith("the user's own\n")
    assert sorted(p.name for p in mine.iterdir()) == ["build.py"]
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "target.json").write_text("someone else's")
    (linked / "trainer.json").symlink_to(tmp_path / "target.json")
    with pytest.raises(UsageError, match="symbolic link"):
        write_workload(trainer, linked)
    assert (tmp_path / "target.json").read_text() == "someone else's"
    ours = tmp_path / "ours"
    first = write_workload(trainer, ours)
    assert write_workload(trainer, ours) == first  # its own folder: written again
    # the seventh probe (P7-4..6): a written file replaced by a folder or a FIFO, and a
    # trainer that is none, are one line, never a raw error or a hang
    (ours / "batch.pt").unlink()
    (ours / "batch.pt").mkdir()
    with pytest.raises(UsageError, match="not a regular file"):
        write_workload(trainer, ours)
    (ours / "batch.pt").rmdir()
    (ours / "config.json").unlink()
    os.mkfifo(ours / "config.json")
    with pytest.raises(UsageError, match="not a regular file"):
        write_workload(trainer, ours)
    with pytest.raises(UsageError, match="takes a transformers Trainer"):
        write_workload("not a trainer", tmp_path / "nt")
