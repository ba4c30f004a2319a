"""Issue 48: no output path destroys anything. ``--output`` never replaces the study's
database (or its journals), the study file or the pin being read, never a folder or a
special file, and a file budgettune did not write only with ``--force``; each is refused in
one line (exit 2) before any trial, the file untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import UsageError
from budgettune.pinning import check_pin_output
from budgettune.trial.spec import TrialSpec

runner = CliRunner()
SEARCH = ["search", "--device", "cpu", "--storage-url", "bt.db", "--num-trials", "0"]
PIN = {
    "schema_version": 1,
    "spec": TrialSpec(compile_mode="eager").to_json_dict(),
    "workload": "builtin:tiny-gpt",
    "limit_bytes": 125_000_000,
    "mem_metric": "device",
}


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    """The CLI's working folder (tests/conftest.py: an empty study database ``bt.db``), with a
    pin and a study file."""
    (cli_workdir / "pin.json").write_text(json.dumps(PIN))
    (cli_workdir / "study.toml").write_text('workload = "builtin:tiny-gpt"\nmax_mem = "1GB"\n')
    return cli_workdir


def _refused(workdir: Path, args: list[str], said: str, kept: str) -> None:
    before = (workdir / kept).read_bytes() if (workdir / kept).exists() else None
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr
    if before is not None:
        assert (workdir / kept).read_bytes() == before


@pytest.mark.parametrize(
    ("args", "said", "kept"),
    [
        ([*SEARCH, "--output", "bt.db"], "which this command reads", "bt.db"),
        ([*SEARCH, "--output", "bt.db", "--force"], "which this command reads", "bt.db"),
        (["search", "study.toml", "--storage-url", "bt.db", "--output", "study.toml"],
         "which this command reads", "study.toml"),
        (["export", "--storage", "bt.db", "--output", "bt.db"], "which this command reads",
         "bt.db"),
        (["export", "--pin", "pin.json", "--output", "study.toml"],
         "not a pinned config budgettune wrote", "study.toml"),
        (["export", "--pin", "pin.json", "--output", "pin.json", "--force"],
         "which this command reads", "pin.json"),
        ([*SEARCH, "--output", "study.toml"], "pass --force to replace it", "study.toml"),
    ],
)  # fmt: skip
def test_an_output_that_would_destroy_a_file_is_refused(
    workdir: Path, args: list[str], said: str, kept: str
) -> None:
    _refused(workdir, args, said, kept)


def test_special_files_and_links_are_refused(workdir: Path) -> None:
    os.mkfifo(workdir / "fifo")
    _refused(workdir, ["export", "--pin", "pin.json", "-o", "fifo", "--force"],
             "is not a regular file", "nothing")  # fmt: skip
    assert (workdir / "fifo").is_fifo()
    (workdir / "elsewhere.txt").write_text("someone's notes")
    (workdir / "link.json").symlink_to(workdir / "elsewhere.txt")
    _refused(workdir, ["export", "--pin", "pin.json", "-o", "link.json"], "symbolic link",
             "elsewhere.txt")  # fmt: skip
    assert (workdir / "link.json").is_symlink()
    with pytest.raises(UsageError, match="is not a regular file"):
        check_pin_output("/dev/null", force=True)


def test_a_pin_budgettune_wrote_is_replaced_and_force_replaces_another_file(
    workdir: Path,
) -> None:
    result = runner.invoke(app, ["export", "--pin", "pin.json", "-o", "best.json"])
    assert result.exit_code == 0, result.output
    again = runner.invoke(app, ["export", "--pin", "pin.json", "-o", "best.json"])
    assert again.exit_code == 0, again.output  # its own pin, recognised
    (workdir / "notes.txt").write_text("not a pin")
    forced = runner.invoke(app, ["export", "--pin", "pin.json", "-o", "notes.txt", "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((workdir / "notes.txt").read_text())["spec"] == PIN["spec"]


def test_the_python_api_refuses_a_bad_output_before_writing_a_trainer_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import budgettune

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()

    class Trainer:  # never reached: the output is refused first
        model = None

    monkeypatch.setattr("budgettune.api._is_trainer", lambda build: True)
    with pytest.raises(UsageError, match="is a folder"):
        budgettune.search(Trainer(), "1GB", output="out", workload_dir="wl")  # type: ignore[arg-type]
    assert not (tmp_path / "wl").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bt.db").write_bytes(b"not to be lost")
    with pytest.raises(UsageError, match="which this command reads"):
        budgettune.search("builtin:tiny-gpt", "1GB", output="bt.db", storage_url="bt.db",
                          device="cpu", force=True)  # fmt: skip
    assert (tmp_path / "bt.db").read_bytes() == b"not to be lost"


def test_a_pin_keeps_the_umask_and_a_replaced_pin_its_mode(
    workdir: Path,
) -> None:
    """Issue 48 item 9: pins came out 0600 whatever the umask (a shared pin unreadable)."""
    old = os.umask(0o022)
    try:
        done = runner.invoke(app, ["export", "--pin", "pin.json", "-o", "shared.json"])
        assert done.exit_code == 0, done.output
        assert (workdir / "shared.json").stat().st_mode & 0o777 == 0o644
        os.chmod(workdir / "shared.json", 0o640)
        again = runner.invoke(app, ["export", "--pin", "pin.json", "-o", "shared.json"])
        assert again.exit_code == 0, again.output
        assert (workdir / "shared.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_a_dashboard_on_an_open_address_is_told_it_has_no_login(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = []
    monkeypatch.setattr("budgettune.present.dashboard.serve", lambda *a, **k: served.append(k))
    done = runner.invoke(app, ["dashboard", "--storage-url", "bt.db", "--host", "0.0.0.0"])
    assert done.exit_code == 0 and served and "has no login" in done.stderr
    local = runner.invoke(app, ["dashboard", "--storage-url", "bt.db"])
    assert local.exit_code == 0 and "no login" not in local.stderr


def test_num_trials_0_on_a_missing_database_makes_none(workdir: Path) -> None:
    """Issue 48 item 9: a refused ``--num-trials 0`` still created an empty database."""
    _refused(workdir, ["search", "--device", "cpu", "--storage-url", "new.db", "--num-trials", "0",
                       "--max-mem", "1GB"], "new.db does not exist", "nothing")  # fmt: skip
    assert not (workdir / "new.db").exists()


def test_a_temp_file_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """Issue 48 item 9: kill -9 during a pin's write left ``.pin.json.XXXX`` behind."""
    import subprocess

    from budgettune.pinning import write_pin

    gone = subprocess.Popen(["true"])  # noqa: S607 - its pid names no process once it ended
    gone.wait()
    orphan = tmp_path / f".pin.json.{gone.pid}.k3j9"
    live = tmp_path / f".pin.json.{os.getppid()}.a8x2"  # a writer still running
    other = tmp_path / ".notes.txt.123.x"  # not this file's
    for path in (orphan, live, other):
        path.write_text("{")
    write_pin(tmp_path / "pin.json", PIN)
    assert not orphan.exists()
    assert live.exists() and other.exists()
    assert json.loads((tmp_path / "pin.json").read_text())["spec"] == PIN["spec"]
