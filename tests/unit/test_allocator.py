"""The pin's allocator setting reaches the job (issue 28): parsed and refused once, given to a
fresh process before CUDA could start, merged with the job's own, and printed for a launch
script by `budgettune export --format env`."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import SpecError
from budgettune.pinning import StalePinWarning, parse_pin, write_pin
from budgettune.trial import allocator
from budgettune.trial.spec import EXPANDABLE, TrialSpec


def _pin(tmp_path: Path, alloc_conf: str = EXPANDABLE, peak: int = 115_605_504_000) -> Path:
    spec = TrialSpec(compile_mode="eager", cuda_alloc_conf=alloc_conf)
    doc = {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 120_000_000_000,
        "mem_metric": "device",
        "measured": {"peak_worst_bytes": peak},
        "fingerprint": {"torch_version": torch.__version__, "device_name": "cpu"},
    }
    return write_pin(tmp_path / "pin.json", doc)


def test_settings_parse_and_a_malformed_one_is_refused() -> None:
    assert allocator.parse_settings("expandable_segments:True, max_split_size_mb:128") == {
        "expandable_segments": "True",
        "max_split_size_mb": "128",
    }
    assert allocator.env_assignment("") == ""
    assert allocator.env_assignment(EXPANDABLE) == f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}"
    for bad in ("$(id)", "expandable_segments", "a:b;rm -rf", "x:1,,:2"):
        with pytest.raises(SpecError, match="key:value"):
            TrialSpec(cuda_alloc_conf=bad)


def test_torchs_per_size_divisions_list_is_one_setting() -> None:
    """Issue 48, P7-7: torch's own example ``roundup_power2_divisions:[256:1,512:2,>:8]`` was
    cut at its commas and refused; a bracket anywhere else, or a malformed list, still is."""
    listed = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
    both = f"expandable_segments:True,{listed}"
    assert allocator.parse_settings(both) == {
        "expandable_segments": "True",
        "roundup_power2_divisions": "[256:1,512:2,1024:4,>:8]",
    }
    assert allocator.format_settings(allocator.parse_settings(both)) == both
    assert TrialSpec(cuda_alloc_conf=listed).cuda_alloc_conf == listed
    assert allocator.split_settings(f" {listed} , default,") == [listed, "default"]
    for bad in (
        "max_split_size_mb:[1:2]",
        "roundup_power2_divisions:[256:x]",
        "roundup_power2_divisions:[256:8,",
        "roundup_power2_divisions:[$(id):1]",
        "roundup_power2_divisions:[256:8]]",
    ):
        with pytest.raises(SpecError, match="key:value|torch takes"):
            TrialSpec(cuda_alloc_conf=bad)


def test_a_searched_list_keeps_a_bracketed_value_whole() -> None:
    from budgettune.cli.knob_options import space_values

    listed = "roundup_power2_divisions:[256:8,>:1]"
    given = space_values({"cuda_alloc_confs": f"default,{listed}"})
    assert given["cuda_alloc_confs"] == ["", listed]


def test_merge_keeps_the_jobs_other_settings_and_names_what_it_replaced() -> None:
    merged, replaced = allocator.merged_setting(
        "max_split_size_mb:64,expandable_segments:False", EXPANDABLE
    )
    assert merged == "max_split_size_mb:64,expandable_segments:True"
    assert replaced == ["expandable_segments:False"]
    assert allocator.merged_setting("", EXPANDABLE) == (EXPANDABLE, [])


_FRESH_JOB = """
import json, os, sys, warnings
warnings.simplefilter("error")  # a fresh job that loads the pin first: nothing to warn about
{before}
import budgettune
pinned = budgettune.load_pinned(sys.argv[1])
import torch
print(json.dumps({{
    "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    "torch_settings": torch._C._accelerator_getAllocatorSettings(),
    "cuda_initialized": torch.cuda.is_initialized(),
}}))
"""


@pytest.mark.parametrize("before", ["", "import torch"], ids=["pin-first", "torch-first"])
def test_a_fresh_job_gets_the_setting_before_cuda_starts(tmp_path: Path, before: str) -> None:
    """The README's lines in a fresh process: torch reads PYTORCH_CUDA_ALLOC_CONF when it is
    imported, so without torch the variable is set, and with torch imported already its setter
    is used; either way before CUDA has started."""
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_JOB.format(before=before), str(_pin(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in __import__("os").environ.items() if k != allocator.ENV_VAR},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["env"] == EXPANDABLE
    assert EXPANDABLE in seen["torch_settings"]
    assert seen["cuda_initialized"] is False


def _fake_torch(reserved: int, settings: str = "") -> types.SimpleNamespace:
    """The few torch entry points `apply_allocator_settings` reads, with CUDA holding memory
    (no GPU here: this is the only way to take the late path on CPU)."""
    state = {"settings": settings}
    cuda = types.SimpleNamespace(
        is_initialized=lambda: reserved > 0,
        device_count=lambda: 1,
        memory_reserved=lambda index: reserved,
    )
    c_module = types.SimpleNamespace(
        _accelerator_getAllocatorSettings=lambda: state["settings"],
        _accelerator_setAllocatorSettings=lambda text: state.update(settings=text),
    )
    return types.SimpleNamespace(__version__="fake", cuda=cuda, _C=c_module, state=state)


def test_late_in_the_job_it_is_set_at_run_time_and_the_pin_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_torch(reserved=3_000_000_000)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(allocator, "_APPLIED", set())
    monkeypatch.setenv(allocator.ENV_VAR, "max_split_size_mb:64")
    pinned = parse_pin(json.loads(_pin(tmp_path).read_text()), source="pin.json")
    with pytest.warns(StalePinWarning) as caught:
        applied = pinned.apply_allocator()
    assert applied.how == "runtime" and applied.reserved_before_bytes == 3_000_000_000
    assert fake.state["settings"] == f"{EXPANDABLE}"  # torch's own (empty) settings + the pin's
    (message,) = [str(w.message) for w in caught]
    assert "CUDA already held 3.00 GB" in message
    assert "115.61 GB peak was measured with it from the start" in message
    assert f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}" in message
    # applied once: `compile` calling it again changes and says nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pinned.apply_allocator().how == "already"


def test_the_jobs_own_conflicting_setting_is_replaced_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_torch(reserved=0, settings="expandable_segments:False,max_split_size_mb:64")
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(allocator, "_APPLIED", set())
    pinned = parse_pin(json.loads(_pin(tmp_path).read_text()), source="pin.json")
    with pytest.warns(StalePinWarning, match="expandable_segments:False replaced"):
        applied = pinned.apply_allocator()
    assert applied.how == "setter" and not applied.caveat
    assert fake.state["settings"] == "expandable_segments:True,max_split_size_mb:64"


def test_export_env_prints_the_launch_line(tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["export", "--format", "env", "--pin", str(_pin(tmp_path))])
    assert done.exit_code == 0, done.output
    assert done.stdout == (
        f"BUDGETTUNE_PIN_ALLOC_CONF={EXPANDABLE}\nPYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}\n"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    done = runner.invoke(app, ["export", "--format", "env", "--pin", str(_pin(bare, ""))])
    # issue 47: never empty, so `export $(budgettune export --format env)` never runs a bare
    # `export` (which prints the whole environment into the job's log)
    assert done.exit_code == 0 and done.stdout == "BUDGETTUNE_PIN_ALLOC_CONF=\n"
