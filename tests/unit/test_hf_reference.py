"""``hf:`` references (issue 9): parsing in the parent, the one-line install hint, configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import WorkloadError
from budgettune.workload import HF_INSTALL_HINT, check_reference, load_workload

CPU = torch.device("cpu")


def test_without_transformers_hf_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    with pytest.raises(WorkloadError, match="pip install 'budgettune\\[hf\\]'"):
        check_reference("hf:gpt2")
    result = CliRunner().invoke(app, ["trial", "--workload", "hf:gpt2", "--device", "cpu"])
    assert result.exit_code == 2
    assert HF_INSTALL_HINT in result.output
    assert "Traceback" not in result.output


def test_a_folder_needs_config_json(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no config.json"):
        check_reference(f"hf:{tmp_path}")
    with pytest.raises(WorkloadError, match="hf:DIR"):
        check_reference("hf:")


def test_folder_config_overrides_and_dropout(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=100).save_pretrained(
        tmp_path
    )
    check_reference(f"hf:{tmp_path}")
    workload = load_workload(f"hf:{tmp_path}", CPU, {"n_layer": 2, "batch_size": 2, "seq_len": 8})
    config = workload.model.config
    assert (config.n_layer, config.n_embd, config.vocab_size) == (2, 32, 100)
    assert config.resid_pdrop == config.attn_pdrop == config.embd_pdrop == 0.0
    assert workload.batch["input_ids"].shape == (2, 8)
    assert next(workload.model.parameters()).dtype == torch.float32  # fp32 on CPU
    kept = load_workload(f"hf:{tmp_path}", CPU, {"keep_dropout": True, "seq_len": 8})
    assert kept.model.config.resid_pdrop == 0.1
    with pytest.raises(WorkloadError, match="no attribute.*n_layers"):
        load_workload(f"hf:{tmp_path}", CPU, {"n_layers": 2})
    with pytest.raises(WorkloadError, match="not a folder with config.json nor a model type"):
        load_workload("hf:no_such_family", CPU, {})
    with pytest.raises(WorkloadError, match="seq_len 2048 is longer"):
        load_workload(f"hf:{tmp_path}", CPU, {"seq_len": 2048})
