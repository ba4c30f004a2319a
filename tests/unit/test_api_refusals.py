"""Issue 48 item 7: the Python API's bad arguments are `UsageError`s (a `BudgettuneError`)
with one line, never a ValueError or TypeError from deep inside, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import budgettune
from budgettune.errors import BudgettuneError, UsageError


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"gpus": "0,1"}, "gpus takes GPU indices"),
        ({"gpus": 0}, "gpus takes GPU indices"),
        ({"gpus": [0, -1]}, "gpus takes GPU indices"),
        ({"options": [1]}, "options takes a mapping"),
        ({"options": "a=1"}, "options takes a mapping"),
    ],
)
def test_bad_api_arguments_are_one_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict, said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=said) as caught:
        budgettune.search("builtin:tiny-gpt", "1GB", device="cpu", **kwargs)
    assert isinstance(caught.value, BudgettuneError) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_trainer_without_a_train_dataset_is_one_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none"
    )
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args)
    with pytest.raises(UsageError, match="give it a train_dataset"):
        budgettune.search(trainer, "1GB", device="cpu", workload_dir="wl")
    assert not (tmp_path / "wl").exists()


@pytest.mark.parametrize(
    ("body", "said"),
    [("num_trials = " + "9" * 5000, "4300 digits"), ("x = " + "[" * 5000 + "]" * 5000, "deep")],
    ids=["huge-int", "deep"],
)
def test_a_hostile_study_file_is_one_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(f'workload = "builtin:tiny-gpt"\nmax_mem = "1GB"\n{body}\n')
    with pytest.raises(UsageError, match=said) as caught:
        budgettune.search("builtin:tiny-gpt", "1GB", study_file="s.toml", device="cpu")
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
