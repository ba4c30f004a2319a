"""benchmarks/reference.py: configurations spread over devices, each measured once, resumable."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

reference = importlib.import_module("benchmarks.reference")
config_sets = importlib.import_module("benchmarks.config_sets")


def test_gpus_flag_names_one_device_per_gpu() -> None:
    args = reference.argparse.Namespace(gpus="0, 2,3", devices="cuda")
    assert reference.devices_of(args) == ["cuda:0", "cuda:2", "cuda:3"]
    args = reference.argparse.Namespace(gpus="", devices="cpu,cpu")
    assert reference.devices_of(args) == ["cpu", "cpu"]


def test_smoke_set_on_two_devices_measures_each_config_once_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "smoke.jsonl"
    argv = [
        "--set", "smoke", "--out", str(out), "--devices", "cpu,cpu",
        "--runs-dir", str(tmp_path / "runs"), "--warmup", "1", "--timed", "2",
    ]  # fmt: skip
    assert reference.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["label"] for r in records) == ["tiny-budget-0.2", "tiny-budget-1.0"]
    assert all(r["result"]["outcome"] == "ok" for r in records)
    assert {r["device_index"] for r in records} <= {"cpu"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0 done, 2 to measure on cpu, cpu"
    # resumable: the same command measures nothing more
    assert reference.main(argv) == 0
    assert len(out.read_text().splitlines()) == 2
    assert capsys.readouterr().out.splitlines()[0] == "2 done, 0 to measure on cpu, cpu"


SETS_BEFORE = Path(__file__).resolve().parents[1] / "data" / "reference_sets.txt"
"""Every set's configurations as the if/elif ``configs`` made them, before it became a table."""


def _typed(value: object) -> object:
    """``value`` with every type spelled out: a tuple is not a list, 1 is not 1.0 nor True."""
    if isinstance(value, dict):
        return ("dict", sorted((key, _typed(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_typed(item) for item in value])
    return (type(value).__name__, value)


def test_every_set_gives_the_configurations_it_gave_before() -> None:
    before = ast.literal_eval(SETS_BEFORE.read_text())
    assert len(before) == 10
    assert sorted(config_sets.SETS) == sorted(before)  # no set lost, none added unchecked
    for name, expected in before.items():
        got = reference.configs(name, warmup=3, timed=7)
        assert [c["label"] for c in got] == [c["label"] for c in expected], name
        assert _typed(got) == _typed(expected), name


def test_an_unknown_set_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown set 'nope'"):
        reference.configs("nope", warmup=2, timed=10)


def test_a_setting_given_twice_is_an_error_of_the_table() -> None:
    fused = config_sets.Choice("fused-", {"optimizer_impl": "fused"})
    every = (config_sets.every(1),)
    row = config_sets.Row("ac-every-{}", "x", {"optimizer_impl": "foreach"}, every)
    block = config_sets.Block("builtin:llama", (row,), each=(fused,))
    with pytest.raises(ValueError, match="fused-ac-every-1: optimizer_impl is set twice"):
        config_sets.expand([block], warmup=2, timed=10)


def test_help_lists_every_set(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        reference.main(["--help"])
    text = capsys.readouterr().out
    assert all(f"  {name} " in text for name in config_sets.SETS)


def test_one_label_on_two_devices_runs_in_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head to head's rounds measure one label on two GPUs at once: a shared run folder let
    one launcher clear the other's result file (a round "exited with code 0 without writing a
    result", 2026-11-27)."""
    folders: list[Path] = []

    def launch(run: object, *, run_dir: Path, timeout_s: float) -> object:
        folders.append(run_dir)
        raise RuntimeError("stop here")

    monkeypatch.setattr(reference, "launch_trial", launch)
    config = reference.configs("smoke", warmup=1, timed=2)[0]
    args = reference.argparse.Namespace(runs_dir=tmp_path, cache=False, timeout=5.0)
    for device in ("cuda:0", "cuda:1"):
        with pytest.raises(RuntimeError, match="stop here"):
            reference.measure(config, device=device, args=args)
    assert len(set(folders)) == 2
    assert all(f.parent == tmp_path and f.name.startswith(config["label"]) for f in folders)
