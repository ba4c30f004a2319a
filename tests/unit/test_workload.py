"""Workload references: parsing and checking in the parent, loading in the child, fingerprints."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from budgettune.errors import SpecError, UsageError, WorkloadError
from budgettune.workload import (
    BUILTINS,
    Workload,
    WorkloadFingerprint,
    builtin_workload,
    check_reference,
    find_blocks,
    fingerprint,
    load_workload,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "user_workload.py"
CPU = torch.device("cpu")
TINY_GPT = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16}


def test_workload_module_does_not_import_torch() -> None:
    code = "import sys, budgettune.workload; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtin_table() -> None:
    assert [b.name for b in BUILTINS] == ["tiny-gpt", "llama", "vit"]
    assert builtin_workload("tiny-gpt").default_device == "cpu"
    assert builtin_workload("llama").target == "budgettune.workloads.llama:build"
    with pytest.raises(WorkloadError, match="known: tiny-gpt, llama, vit"):
        builtin_workload("gpt5")


@pytest.mark.parametrize(
    "ref",
    [
        "builtin:tiny-gpt",
        "builtin:llama",
        "builtin:vit",
        f"{FIXTURE}:build",
        f"{FIXTURE}:Tiny",
        "budgettune.workloads.tiny_gpt:build",
    ],
)
def test_check_reference_accepts(ref: str) -> None:
    check_reference(ref)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("builtin:nope", "unknown built-in workload 'nope'; known: tiny-gpt, llama, vit"),
        ("builtin:", "unknown built-in workload ''"),
        ("train.py", "malformed"),
        ("no_colon_at_all", "malformed"),
        (":build", "malformed"),
        ("train.py:", "malformed"),
        ("train.py:not-an-identifier", "malformed"),
        ("pkg mod:fn", "malformed"),
        ("does/not/exist.py:build", "workload file does/not/exist.py not found"),
        (f"{FIXTURE}:missing_fn", "defines no top-level 'missing_fn'"),
        ("no_such_package_xyz.module:build", "module no_such_package_xyz.module not found"),
        ("budgettune.no_such_module:build", "module budgettune.no_such_module not found"),
    ],
)
def test_check_reference_rejects(ref: str, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        check_reference(ref)
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(info.value, UsageError)
    if "malformed" in message:
        assert "builtin:NAME, hf:DIR_OR_TYPE, path/to/file.py:fn or pkg.module:fn" in text


def test_check_reference_does_not_import_user_code(tmp_path: Path) -> None:
    user = tmp_path / "train.py"
    user.write_text("raise SystemExit('imported!')\ndef build(device): ...\n")
    check_reference(f"{user}:build")


def test_load_builtin() -> None:
    workload = load_workload("builtin:tiny-gpt", CPU, TINY_GPT)
    assert isinstance(workload, Workload)
    assert workload.blocks is not None and len(workload.blocks) == 2
    assert workload.loss(workload.model, workload.batch).ndim == 0


def test_load_module_reference() -> None:
    workload = load_workload("budgettune.workloads.tiny_gpt:build", CPU, TINY_GPT)
    assert workload.blocks is not None and len(workload.blocks) == 2


def test_load_file_reference_fills_blocks() -> None:
    workload = load_workload(f"{FIXTURE}:build", CPU, {"batch_size": 3})
    assert workload.batch["x"].shape == (3, 8)
    assert workload.blocks is not None
    assert list(workload.blocks) == list(workload.model.layers)
    loss = workload.loss(workload.model, workload.batch)
    loss.backward()


def test_load_file_reference_relative_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURE.parent)
    workload = load_workload("user_workload.py:build", CPU)
    assert workload.batch["x"].shape == (5, 8)


def test_builder_that_raises_is_one_line_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    ref = f"{FIXTURE}:build_raises"
    with caplog.at_level(logging.ERROR, logger="budgettune.workload"):
        with pytest.raises(WorkloadError) as info:
            load_workload(ref, CPU)
    assert str(info.value) == (
        f"workload {ref} raised ValueError: bad dim (full traceback in the trial log)"
    )
    record = caplog.records[-1]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "Traceback" in caplog.text and "second line of detail" in caplog.text


def test_import_error_is_one_line_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    user = tmp_path / "broken.py"
    user.write_text("import no_such_module_xyz\n\ndef build(device): ...\n")
    with caplog.at_level(logging.ERROR, logger="budgettune.workload"):
        with pytest.raises(WorkloadError, match="ModuleNotFoundError") as info:
            load_workload(f"{user}:build", CPU)
    assert "\n" not in str(info.value)
    assert "Traceback" in caplog.text


def test_file_can_import_its_siblings(tmp_path: Path) -> None:
    (tmp_path / "my_model_sibling.py").write_text("WIDTH = 7\n")
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "from my_model_sibling import WIDTH\n"
        "from budgettune import Workload\n"
        "def build(device):\n"
        "    model = torch.nn.Linear(WIDTH, 1)\n"
        "    return Workload(model=model, batch=torch.ones(2, WIDTH),\n"
        "                    loss=lambda m, b: m(b).sum())\n"
    )
    workload = load_workload(f"{tmp_path / 'train.py'}:build", CPU)
    assert workload.model.in_features == 7
    assert workload.blocks == []


def test_builder_returning_non_workload() -> None:
    with pytest.raises(WorkloadError, match="returned dict, not a budgettune.Workload"):
        load_workload(f"{FIXTURE}:build_wrong_type", CPU)


def test_missing_function_at_load() -> None:
    with pytest.raises(WorkloadError, match="defines no top-level 'nope'"):
        load_workload(f"{FIXTURE}:nope", CPU)
    with pytest.raises(WorkloadError, match="has no function 'nope'"):
        load_workload("budgettune.workloads.tiny_gpt:nope", CPU)


def test_unknown_option_names_the_accepted_ones() -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload("builtin:tiny-gpt", CPU, {"batch": 8, "d_model": 64})
    text = str(info.value)
    assert "no option(s) batch" in text
    assert "vocab_size, d_model, n_layers, n_heads, batch_size, seq_len" in text
    with pytest.raises(WorkloadError, match="accepted: batch_size"):
        load_workload(f"{FIXTURE}:build", CPU, {"seq_len": 3})


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)


class _Other(nn.Module):
    pass


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.short = nn.ModuleList(_Block() for _ in range(2))
        self.mixed = nn.ModuleList([_Block(), _Other(), _Block(), _Other(), _Block()])
        self.inner = nn.Sequential(nn.Module())
        self.inner.add_module("deep", nn.ModuleList(_Block() for _ in range(4)))


def test_find_blocks_takes_every_stack_in_model_order() -> None:
    # two stacks of the same blocks (an encoder and a decoder), one nested deeper: both, in
    # model order; the list of mixed classes is not a stack
    model = _Nested()
    blocks = find_blocks(model)
    expected = [*model.short, *model.inner.deep]
    assert len(blocks) == 6
    assert all(a is b for a, b in zip(blocks, expected, strict=True))


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(16, 16)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))


def test_find_blocks_skips_small_lists_and_lists_inside_a_block() -> None:
    model = nn.Module()
    model.norms = nn.ModuleList(nn.LayerNorm(16) for _ in range(3))  # 32 vs 1360 per block
    model.layers = nn.ModuleList(_Layer() for _ in range(3))
    blocks = find_blocks(model)
    assert all(a is b for a, b in zip(blocks, model.layers, strict=True))
    assert len(blocks) == 3  # not the experts inside each layer, not the norms


def test_find_blocks_ignores_mixed_lists_and_handles_none() -> None:
    model = nn.Module()
    model.mixed = nn.ModuleList([_Block(), _Other(), _Block()])
    assert find_blocks(model) == []
    assert find_blocks(nn.Linear(2, 2)) == []


def test_fingerprint_stable_and_sensitive() -> None:
    torch.manual_seed(0)
    first = fingerprint(load_workload("builtin:tiny-gpt", CPU, TINY_GPT))
    torch.manual_seed(1)
    second = fingerprint(load_workload("builtin:tiny-gpt", CPU, TINY_GPT))
    assert first == second
    assert len(first.digest) == 16 and int(first.digest, 16) >= 0
    assert first.batch == ("int64[4, 16]", "int64[4, 16]")
    other = fingerprint(load_workload("builtin:tiny-gpt", CPU, {**TINY_GPT, "batch_size": 2}))
    assert other.digest != first.digest
    assert other.param_count == first.param_count
    assert first.param_bytes == 4 * first.param_count


def test_fingerprint_counts_tied_parameters_once() -> None:
    tied = fingerprint(load_workload("builtin:tiny-gpt", CPU, TINY_GPT))
    untied = fingerprint(
        load_workload("builtin:tiny-gpt", CPU, {**TINY_GPT, "tie_embeddings": False})
    )
    assert untied.param_count - tied.param_count == 64 * 32


def test_fingerprint_json_round_trip() -> None:
    fp = fingerprint(load_workload(f"{FIXTURE}:build", CPU))
    assert fp.batch == ("float32[5, 8]", "int64[5]")
    assert WorkloadFingerprint.from_json_dict(fp.to_json_dict()) == fp
    with pytest.raises(SpecError):
        WorkloadFingerprint.from_json_dict({"param_count": 1})
