"""benchmarks/edge_replay.py on the kept L1 and L3 studies: the README says the memory edge
never starts at L1 (every block-AC point of its map fits) and starts at L3 once op AC on
every 2nd block is measured over the limit."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from budgettune.errors import BudgettuneError

edge_replay = importlib.import_module("benchmarks.edge_replay")
DB = Path(__file__).resolve().parents[2] / "benchmarks/results/h200-tuner-2026-11-25/tuner.db"


def _edges(capsys: pytest.CaptureFixture[str], study: str) -> list[str]:
    assert edge_replay.main([f"sqlite:///{DB}", study]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [line.split("edge: ")[1] for line in lines[1:]]


def test_the_edge_never_starts_at_l1(capsys: pytest.CaptureFixture[str]) -> None:
    edges = _edges(capsys, "tuner-L1-open30")
    assert len(edges) == 20 and set(edges) == {"-"}


def test_at_l3_it_starts_once_op_ac_every_2nd_block_is_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    edges = _edges(capsys, "tuner-L3-m0-open30")
    assert edges[:10] == ["-"] * 10  # trial 10 is structured-op-2, 23.21 GB
    assert set(edges[10:]) == {"op-2, op-4"}


def test_a_missing_study_is_one_error() -> None:
    with pytest.raises(BudgettuneError, match="no study 'nope'"):
        edge_replay.main([f"sqlite:///{DB}", "nope"])
