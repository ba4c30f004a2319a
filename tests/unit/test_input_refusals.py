"""Issue 29: bad flags, pins and study names get one line and exit 2 before any work (no trial,
no folder, the database untouched); a study name never leaves the runs folder; user text in the
study note stays text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import UsageError
from budgettune.study.spec import STUDY_NAME_PATTERN, check_study_name
from budgettune.study.study import default_study_name
from budgettune.trial.spec import TrialSpec

runner = CliRunner()
SEARCH = ["search", "--device", "cpu", "--storage", "bt.db"]


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    """A working folder holding a real, empty study database ``bt.db`` (tests/conftest.py)."""
    return cli_workdir


def _refused(workdir: Path, args: list[str], said: str) -> str:
    """Invoke; assert exit 2, one line holding ``said``, the database and the folder untouched."""
    before = (workdir / "bt.db").read_bytes()
    listing = sorted(p.name for p in workdir.iterdir())
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr
    assert (workdir / "bt.db").read_bytes() == before
    assert sorted(p.name for p in workdir.iterdir()) == listing  # no runs folder, no pin
    return lines[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-mem", "999999999999999999999PB"], "more than the largest size accepted"),
        (["--max-mem", "1GB", "--timeout", "0"], "--trial-timeout-s must be a number of"),
        (["--max-mem", "1GB", "--timeout", "-5"], "--trial-timeout-s must be a number of"),
        (["--max-mem", "1GB", "--timeout", "inf"], "--trial-timeout-s must be a number of"),
        (["--max-mem", "1GB", "--collective-timeout", "-1"], "--collective-timeout-s must be"),
        (["--max-mem", "1GB", "--seed", "-1"], "--sampler-seed must be an integer from 0 to"),
        (["--max-mem", "1GB", "--trials", "-1"], "--num-trials must be an integer from 0 to"),
        # issue 48: a search of 10^23 trials started and ran 212 trials before it was stopped
        (["--max-mem", "1GB", "--num-trials", "9" * 23], "--num-trials must be an integer from 0"),
        (["--max-mem", "1GB", "--top-k", "9" * 26], "--top-k must be an integer from 1"),
        (["--max-mem", "1GB", "--reverify-runs", "1000000000"], "--reverify-runs must be an"),
        (["--max-mem", "1GB", "--nproc-per-node", "1000000"], "must be an integer from 1 to 4096"),
        (["--max-mem", "1GB", "--warmup-steps", "1000000000000"], "warmup_steps must be from 1"),
        (["--max-mem", "1GB", "--estimators", "flops,profile"], "'profile' needs CUDA"),
        (["--max-mem", "1GB", "--fix", "runtime_estimator=profile"], "'profile' needs CUDA"),
        (["--max-mem", "1GB", "--alloc-confs", "$(id)"], "'$(id)' is not a setting"),
        (["--max-mem", "1GB", "--fix", "cuda_alloc_conf=$(id)"], "'$(id)' is not a setting"),
        (["--max-mem", "1GB", "--ac-every", "0,-1"], "non-negative strides"),
        (["--max-mem", "1GB", "--study", "../x"], "--study-name '../x' is not a study name"),
        (["--max-mem", "1GB", "--study", "/abs/path"], "--study-name '/abs/path' is not a study"),
    ],
)
def test_bad_search_flags_are_refused_before_any_trial(workdir: Path, args, said) -> None:
    _refused(workdir, [*SEARCH, *args], said)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["trial", "--timeout", "0"], "--trial-timeout-s must be a number of seconds > 0"),
        (["trial", "--trial-timeout-s", "nan"], "--trial-timeout-s must be a number of seconds"),
        (["trial", "--collective-timeout", "-1"], "--collective-timeout-s must be a number"),
        (
            ["verify", "pin.json", "--timeout", "0"],
            "--trial-timeout-s must be a number of seconds",
        ),
        (["verify", "pin.json", "--runs", "0"], "--reverify-runs must be at least 1, got 0"),
    ],
)
def test_bad_trial_and_verify_flags_are_refused_before_any_run(workdir: Path, args, said) -> None:
    _pin(workdir / "pin.json")
    _refused(workdir, [*args, "--device", "cpu"] if args[0] == "trial" else args, said)


def test_a_limit_with_its_unit_under_the_floor_is_not_called_unitless(workdir: Path) -> None:
    line = _refused(workdir, [*SEARCH, "--max-mem", "0.9MiB"], "--max-mem 0.9MiB is 943.72 kB")
    assert "under the floor of 1.05 MB (1.00 MiB)" in line and "unit" not in line


def test_negative_gpus_are_reported_as_gpus(workdir: Path) -> None:
    line = _refused(workdir, ["search", "--max-mem", "1GB", "--gpus", "-1"], "--gpus -1: list")
    assert "--device" not in line
    _refused(workdir, ["search", "--max-mem", "1GB", "--gpus", "0,0"], "distinct GPU indices")
    _refused(workdir, ["search", "--max-mem", "1GB", "--gpus", "a,b"], "--gpus 'a,b' is not a")
    _refused(
        workdir,
        ["search", "--max-mem", "1GB", "--gpus", "0,1", "--nproc-per-node", "0"],
        "--nproc-per-node must be at least 1, got 0",
    )


def test_an_output_that_is_a_folder_is_refused_before_the_search_and_export(
    workdir: Path,
) -> None:
    (workdir / "pins").mkdir()
    _refused(workdir, [*SEARCH, "--max-mem", "1GB", "--output", "pins"], "--output pins is a")
    (workdir / "a-file").write_text("")
    _refused(workdir, [*SEARCH, "--max-mem", "1GB", "--output", "a-file/pin.json"], "not a folder")
    _refused(workdir, ["export", "--storage", "bt.db", "-o", "pins"], "name the pin's file")


def _pin(path: Path, **changes: object) -> Path:
    doc = {
        "schema_version": 1,
        "spec": TrialSpec(compile_mode="eager").to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 125_000_000,
        "mem_metric": "device",
        "world_size": 1,
    }
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"limit_bytes": "lots"}, "the pin's limit_bytes is 'lots'; it must be an integer > 0"),
        ({"world_size": "abc"}, "the pin's world_size is 'abc'; it must be an integer >= 1"),
        ({"workload": None}, "the pin's workload is missing; it must be a non-empty string"),
        ({"mem_metric": "rss"}, "mem_metric is 'rss'; it must be one of device, reserved"),
        ({"device": "cuda:-1"}, "the pin's device is 'cuda:-1'; it must be cpu, cuda or cuda:N"),
    ],
)
def test_a_pin_with_a_bad_field_is_one_line_for_export_and_verify(
    workdir: Path, changes, said
) -> None:
    pin = _pin(workdir / "pin.json", **changes)
    _refused(workdir, ["export", "--pin", str(pin), "-o", "out.json"], said)
    _refused(workdir, ["verify", str(pin)], said)  # before any run is launched


def test_the_dashboard_refuses_a_port_out_of_range(workdir: Path) -> None:
    _refused(workdir, ["dashboard", "--storage", "bt.db", "--port", "70000"], "--port must be")
    _refused(workdir, ["dashboard", "--storage", "bt.db", "--port", "-1"], "within 0..65535")


def test_a_worker_refuses_a_study_name_that_leaves_the_runs_folder(workdir: Path) -> None:
    for name in ("../x", "/abs/path", "a/b", ".."):
        _refused(workdir, ["worker", "--study", name, "--storage", "bt.db"], "not a study name")
    assert not (workdir.parent / "x").exists()


def test_study_names_are_checked_and_default_names_always_pass() -> None:
    for good in ("tiny-gpt-cpu-125MB-device", "llama_1b.v2", "_x", "9"):
        check_study_name(good)
    for bad in ("", "..", ".hidden", "-x", "a b", "a/b", "a\\b", "x" * 201, "a`b", "abc\n", 3):
        with pytest.raises(UsageError, match="not a study name: use 1 to 200 letters"):
            check_study_name(bad)
    odd = {"source": "../a b/`x`", "tag": "<b>", "lr": 1e-05}
    for workload in ("builtin:tiny-gpt", "../evil dir/train.py:build", "hf:/models/x y/", "m:f"):
        name = default_study_name(workload, odd, "cuda:1", 2e10, "device", nproc_per_node=2)
        assert STUDY_NAME_PATTERN.match(name), name
        assert name.endswith("-cuda-20000MB-device-x2")
    long_a = default_study_name("builtin:tiny-gpt", {"x": "a" * 300}, "cpu", 1e9, "device")
    long_b = default_study_name("builtin:tiny-gpt", {"x": "a" * 301}, "cpu", 1e9, "device")
    assert STUDY_NAME_PATTERN.match(long_a) and long_a != long_b  # cut, kept distinct
    # the names of existing studies do not change
    assert default_study_name("builtin:tiny-gpt", {}, "cpu", 125e6, "device") == (
        "tiny-gpt-cpu-125MB-device"
    )


def test_user_text_in_the_study_note_stays_text() -> None:
    """A workload with a backtick broke out of the note's code span (Markdown)."""
    from markdown_it import MarkdownIt

    from budgettune.present.dashboard_views import code_span, markdown_text, study_note

    workload = "evil``x`.py:build <img src=x onerror=alert(1)>\n\n# heading"
    note = study_note(
        study_name="s<script>*_x_*", search={"workload": workload}, points=[], num_failed=0,
        pin=None,
    )  # fmt: skip
    html = MarkdownIt("commonmark", {"html": True}).render(note)
    flat = workload.replace("\n", " ")
    code = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"<code>{code}</code>" in html  # one span, the text whole
    assert "<img" not in html and "<script" not in html
    assert html.count("<em>") == 1  # the note's own footer, not the study name's *_x_*
    assert "<h1>" not in html and "s&lt;script&gt;*_x_*</h2>" in html
    assert code_span("a") == "`a`" and code_span("`a``") == "``` `a`` ```"
    assert markdown_text("[x](y)") == "\\[x\\]\\(y\\)"
