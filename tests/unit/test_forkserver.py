"""The trial server's own process (`budgettune.trial.forkserver.main`), without forking."""

from __future__ import annotations

import io
import json
import os
import signal
import sys

import pytest

from budgettune.trial import forkserver


def test_the_server_imports_with_cuda_availability_asked_of_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.cuda.is_available() otherwise starts the CUDA driver (cuInit), and no child forked
    # after that can use CUDA: on the GPU hosts every server refused to serve (issue 44)
    seen: dict[str, str | None] = {}

    def preload(modules: list[str]) -> list[str]:
        seen["during imports"] = os.environ.get(forkserver.NVML_CHECK)
        return []

    monkeypatch.delenv(forkserver.NVML_CHECK, raising=False)
    monkeypatch.setattr(forkserver, "_preload", preload)
    monkeypatch.setattr(forkserver, "cuda_touched", lambda: "")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no requests: serve none, end
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert forkserver.main([]) == 0
    finally:
        signal.signal(signal.SIGINT, handler)
    assert seen == {"during imports": "1"}
    assert json.loads(capsys.readouterr().out.splitlines()[0])["ready"] is True
