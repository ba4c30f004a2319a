"""Micro-batches as a range of powers of two (issue 46): ``--micro-batches 1..32``, a study
file's ``micro_batches = "1..32"`` and the API's ``space={"micro_batches": "1..32"}`` each
name 1, 2, 4, ..., 32; anything else that is not a list is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import SpecError, StudyFileError, UsageError
from budgettune.study.batch import powers_of_two
from budgettune.study.study_file import build_search_spec, read_study_file


def test_a_range_names_the_powers_of_two_between_its_ends() -> None:
    assert powers_of_two("1..32") == [1, 2, 4, 8, 16, 32]
    assert powers_of_two(" 4..4 ") == [4]
    bad_ranges = ("3..8", "8..2", "0..4", "1..", "x..y", "1..3", "1-32", "2..2097152", "1..8..16",
                  "\u0661..\u0668", "1..1_6")  # fmt: skip
    for bad in bad_ranges:
        with pytest.raises(UsageError, match="range of powers of two"):
            powers_of_two(bad)


def _sizes(micro_batches: object) -> tuple[int, ...]:
    search = build_search_spec(
        {
            "max_mem": "1GB",
            "global_batch": 16,
            "workload_options": {"batch_size": 4},
            "space": {"micro_batches": micro_batches},
        },
        default_device="cpu",
    )
    return tuple(search.space.lists["micro_batches"])


def test_the_search_spec_takes_a_range_or_a_list() -> None:
    assert _sizes("2..8") == (2, 4, 8)
    assert _sizes([2, 4]) == (2, 4)
    with pytest.raises(SpecError, match="range of powers of two"):
        _sizes("3..8")


def test_a_study_file_takes_the_range_and_refuses_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        'max_mem = "1GB"\nglobal_batch = 16\n[space]\nmicro_batches = "1..16"\n', encoding="utf-8"
    )
    values = read_study_file(good)
    search = build_search_spec(
        {**values, "workload_options": {"batch_size": 4}}, default_device="cpu"
    )
    assert search.space.lists["micro_batches"] == (1, 2, 4, 8, 16)
    bad = tmp_path / "bad.toml"
    bad.write_text('max_mem = "1GB"\n[space]\nmicro_batches = "2..6"\n', encoding="utf-8")
    with pytest.raises(StudyFileError, match="micro_batches"):
        read_study_file(bad)


def test_the_cli_expands_it_and_says_a_bad_one_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "search", "-w", "builtin:tiny-gpt", "--device", "cpu", "--max-mem", "1GB",
            "--global-batch", "8", "--micro-batches", "2..6", "--num-trials", "0",
            "--storage-url", f"sqlite:///{tmp_path / 'b.db'}",
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "range of powers of two" in result.output
    assert not (tmp_path / "b.db").exists()  # refused before anything is written
    assert "1..32" in CliRunner().invoke(app, ["search", "--help"], terminal_width=200).output
