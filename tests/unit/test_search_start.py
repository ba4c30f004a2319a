"""What a search does before its first trial and after its last (issue 44: seconds on the
critical path of a 4-GPU search of about three minutes)."""

from __future__ import annotations

import subprocess

import pytest

from budgettune.errors import SpecError
from budgettune.trial import launcher
from budgettune.trial.op_lists import DEFAULT_ADDABLE_OPS_CUDA, DEFAULT_REMOVABLE_OPS


def test_the_default_ops_need_no_torch_import_and_a_user_op_still_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[str]] = []
    real_run = subprocess.run

    def run(command, **kwargs):
        asked.append(list(command))
        return real_run(command, **kwargs)

    monkeypatch.setattr(launcher.subprocess, "run", run)
    launcher.check_ops_exist(list(DEFAULT_REMOVABLE_OPS + DEFAULT_ADDABLE_OPS_CUDA))
    assert asked == []  # budgettune's own defaults: no child importing torch for 2-5 s
    with pytest.raises(SpecError, match="aten.bogus"):
        launcher.check_ops_exist(["aten.add", "aten.bogus"])
    assert len(asked) == 1 and asked[0][-1] == "aten.bogus"  # only what the user named
