"""benchmarks/fork_program.py: a kept run's configuration run forked from trial servers and as
new processes, each in compile caches of its own, and the rows it reports."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from benchmarks import fork_program
from storage_samples import run_result

from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun


class _Servers:
    closed = False
    started = 0
    ready_wait_s = 0.0

    def prestart(self, envs) -> None:  # type: ignore[no-untyped-def]
        self.started += len(envs)

    def close(self) -> None:
        self.closed = True


def test_forked_runs_come_from_the_servers_fresh_ones_do_not_each_in_its_own_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "SPEC.json"
    run = TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt", cache_root="/study/caches")
    spec.write_text(json.dumps(run.to_json_dict()))
    servers = _Servers()
    seen: list[tuple[str, str | None, bool]] = []
    lock = threading.Lock()

    def launch_trial(own, *, run_dir, timeout_s, servers):  # type: ignore[no-untyped-def]
        (run_dir / "caches").mkdir(parents=True)  # what a compile leaves there
        if servers is not None:
            (run_dir / "trial.log").write_text("forked by trial server 1 as 2\n")
        with lock:
            seen.append((run_dir.name, own.cache_root, servers is not None))
        if run_dir.name == "fresh-1":
            return TrialResult(outcome=TrialOutcome.CRASHED, error="boom")
        return dataclasses.replace(run_result(8_879_000_576, 55.184), phases_s={"compile": 40.04})

    monkeypatch.setattr("budgettune.trial.launcher.launch_trial", launch_trial)
    monkeypatch.setattr("budgettune.trial.launcher.trial_servers", lambda run, log: servers)
    out = tmp_path / "out"
    rows = fork_program.measure(spec, out, forked=2, fresh=2, at_once=2, timeout_s=60.0)
    assert sorted(seen) == [
        (f"{kind}-{i}", str(out / f"{kind}-{i}" / "caches"), kind == "forked")
        for kind in ("forked", "fresh")
        for i in (0, 1)
    ]
    assert [row["run"] for row in rows] == ["forked-0", "forked-1", "fresh-0", "fresh-1"]
    assert rows[0] == {
        "kind": "forked", "run": "forked-0", "served": True, "outcome": "ok",
        "peak_allocated_bytes": 8_879_000_576, "step_time_ms": 55.18, "compile_s": 40.0,
    }  # fmt: skip
    assert rows[3]["outcome"] == "crashed" and rows[3]["peak_allocated_bytes"] is None
    assert [row["served"] for row in rows] == [True, True, False, False]
    assert servers.started == 2  # one a run of a batch, each forked run waits for its own
    assert servers.ready_wait_s == 60.0
    assert servers.closed and not any((out / r["run"] / "caches").exists() for r in rows)
    assert [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()] == rows


@pytest.mark.parametrize(
    "flags",
    [
        ["--forked", "-1"],
        ["--forked", "0", "--fresh", "0"],
        ["--at-once", "0"],
        ["--timeout-s", "0"],
    ],
)
def test_counts_that_run_nothing_are_refused_in_one_line(
    tmp_path: Path, flags: list[str], capsys
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        fork_program.main([str(tmp_path / "SPEC.json"), "--out", str(tmp_path / "out"), *flags])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: --" in last and ("counts" in last or "positive" in last)
    assert not (tmp_path / "out").exists()  # refused before anything is written
