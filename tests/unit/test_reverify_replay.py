"""benchmarks/reverify_replay.py: a kept search's runs read from its archive, and its rounds
walked under the pair rule of the code and the largest-noise rule before it."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from benchmarks.reverify_replay import kept_runs, main, replay

# h200-probe-2026-11-29's gpt2m-mixed-b: trial 6's cold run compiled another program
TRIALS = {1: 64.34, 6: 55.18, 8: 54.9, 14: 51.81}
RUNS = {1: [63.97], 6: [60.85, 55.23], 8: [55.45, 54.98, 55.49], 14: [52.36, 51.75, 51.93]}


def _archive(path: Path) -> Path:
    def add(tar: tarfile.TarFile, run: str, ms: float | None) -> None:
        body = json.dumps({"measurement": None if ms is None else {"step_time_ms": ms}}).encode()
        info = tarfile.TarInfo(f"./study/{run}/RESULT.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))

    with tarfile.open(path, "w:gz") as tar:
        for n, ms in TRIALS.items():
            add(tar, f"trial-{n:04d}", ms)
        for n, times in RUNS.items():
            for k, ms in enumerate(times):
                add(tar, f"reverify-{n:04d}-{k}", ms)
        add(tar, "reverify-unconstrained-0000-0", 54.9)  # the report's: not a candidate
        add(tar, "trial-0002", None)  # failed: no step time
    return path


def test_the_archive_gives_each_trial_and_its_runs_in_order(tmp_path: Path) -> None:
    trials, runs = kept_runs(_archive(tmp_path / "logs.tgz"))
    assert trials == TRIALS and runs == RUNS


def test_the_pair_rule_saves_the_third_round_the_largest_noise_took() -> None:
    assert replay(TRIALS, RUNS, "largest") == (
        [[1, 6, 8, 14], [14, 8, 6], [14, 8]],
        "leader trial 14",
    )
    assert replay(TRIALS, RUNS, "pair") == ([[1, 6, 8, 14], [14, 6]], "leader trial 14")


def test_a_rule_asking_for_a_run_never_made_says_so() -> None:
    runs = {**RUNS, 8: [55.45]}
    walked, end = replay(TRIALS, runs, "largest")
    assert walked == [[1, 6, 8, 14]] and end == "asks for a run the search did not make"


def test_the_command_prints_both_rules(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([str(_archive(tmp_path / "logs.tgz"))]) == 0
    out = capsys.readouterr().out
    assert "largest  rounds [[1, 6, 8, 14], [14, 8, 6], [14, 8]]" in out
    assert "pair     rounds [[1, 6, 8, 14], [14, 6]]: leader trial 14" in out


def test_a_file_that_is_no_archive_is_one_error_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "logs.tgz"
    bad.write_text("not a tar")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.reverify_replay", str(bad)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], check=False,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: {bad}: not a search's logs archive (a .tgz of run folders)"
    ]
