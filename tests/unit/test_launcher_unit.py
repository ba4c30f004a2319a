"""Parent-side helpers of the launcher and CLI that need no child process."""

from __future__ import annotations

from pathlib import Path

import pytest

from budgettune.cli import parse_options
from budgettune.errors import DeviceUnavailableError, TrialInfrastructureError, UsageError
from budgettune.trial.devices import check_device_available, cuda_device_count, visible_device_env
from budgettune.trial.launcher import folder_fault, launch_trial
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


def test_visible_device_env_pins_one_gpu(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_device_env("cuda:3") == ("cuda", {"CUDA_VISIBLE_DEVICES": "3"})
    assert visible_device_env("cuda") == ("cuda", {})
    assert visible_device_env("cpu") == ("cpu", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert visible_device_env("cuda:1") == ("cuda", {"CUDA_VISIBLE_DEVICES": "6"})
    with pytest.raises(DeviceUnavailableError, match="shows only 2"):
        visible_device_env("cuda:2")


def test_cuda_on_a_machine_without_one_is_refused(monkeypatch) -> None:
    import budgettune.trial.devices as devices

    assert isinstance(cuda_device_count(), int)  # the real NVML probe never raises
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU"):
        check_device_available("cuda")
    check_device_available("cpu")
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    check_device_available("cuda:1")
    with pytest.raises(DeviceUnavailableError, match=r"cuda:0..cuda:1"):
        check_device_available("cuda:2")


def test_parse_options() -> None:
    assert parse_options(["batch_size=8", "lr=0.5", "name=x", "flag=true"]) == {
        "batch_size": 8,
        "lr": 0.5,
        "name": "x",
        "flag": True,
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_options(["batch_size"])


def test_a_ctrl_c_swallowed_while_a_child_forks_is_raised_again() -> None:
    """CPython drops a KeyboardInterrupt raised in an at-fork hook (logging's lock release)
    when Popen has a preexec_fn; the launcher's guard raises it again on the way out."""
    import signal

    import pytest

    from budgettune.trial.processes import interrupts_kept

    with pytest.raises(KeyboardInterrupt), interrupts_kept():
        try:  # what the at-fork hook does with it
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with interrupts_kept():  # no Ctrl-C, nothing raised
        pass
    with pytest.raises(KeyboardInterrupt), interrupts_kept():  # an ordinary one goes through
        signal.raise_signal(signal.SIGINT)


def test_a_run_folder_that_cannot_be_made_is_a_file_system_fault_not_a_crash(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the runs folder should be\n")
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", device="cpu")
    with pytest.raises(TrialInfrastructureError) as raised:
        launch_trial(run, run_dir=blocker / "s" / "trial-0000", timeout_s=5)
    line = str(raised.value)
    assert f"could not use {blocker}" in line and "not its configuration's" in line
    assert "\n" not in line
    assert blocker.read_text().startswith("a file")  # nothing written, no child started
    assert folder_fault(tmp_path) is None  # a folder that takes a file is fine
    assert "Not a directory" in (folder_fault(blocker) or "")
