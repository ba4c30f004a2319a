"""Issue 33 end to end on CPU: real trial processes with offload on, through `budgettune search`,
`show` and the pin. On CPU the "host" is the same memory, so offload saves nothing here: what is
proven is that the trial measures what offload moved and held, that ``--max-host-mem`` keeps
a configuration out, and that the pin and `show` carry the figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from budgettune.cli import app

runner = CliRunner()


def _search(tmp_path: Path, *options: str) -> Result:
    tmp_path.mkdir()
    args = [
        "search", "--workload", "builtin:tiny-gpt", "--device", "cpu", "--max-mem", "1GB",
        "--storage", str(tmp_path / "bt.db"), "--study", "s", "--runs-dir", str(tmp_path / "runs"),
        "--warmup-steps", "1", "--timed-steps", "1", "--top-k", "1", "--reverify", "1",
        "--trials", "2", "--output", str(tmp_path / "pin.json"),
        # compiled (codegen-free): under full block AC a compiled block still saves its input
        # through offload's hooks (eager, checkpoint's own hooks hold everything)
        "--backend", "aot_eager_decomp_partition", "--solvers", "dp", "--remove-ops", "",
        "--add-ops", "", "--fix", "offload_every=1",
        # a block's input is 8 x 192 x 256 fp32, 1.5 MiB: over the 1 MiB offload moves at least
        "--option", "batch_size=8", *options,
    ]  # fmt: skip
    return runner.invoke(app, args)


def test_a_search_with_offload_pins_its_figures_and_the_host_limit_keeps_it_out(
    tmp_path: Path,
) -> None:
    over = _search(tmp_path / "over", "--max-host-mem", "2MB")
    assert over.exit_code == 3, over.output
    line = " ".join(over.output.split())
    assert "held more host memory than --max-host-mem 2.00 MB" in line, line

    result = _search(tmp_path / "ok")
    assert result.exit_code == 0, result.output
    pin = json.loads((tmp_path / "ok" / "pin.json").read_text())
    assert pin["spec"]["offload_every"] == 1
    measured = pin["measured"]
    assert measured["offload_bytes"] > 2**20 and measured["host_peak_worst_bytes"] > 2**20
    assert pin["host_limit_bytes"] > 2**30  # half of this host's memory
    assert pin["no_offload"] is None  # every trial offloaded (fixed)
    shown = runner.invoke(app, ["show", "--storage", str(tmp_path / "ok" / "bt.db")])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "host memory for offload" in text and "offload every 1" in text
    assert "to host memory and back per step" in text
    assert "nothing without offload fit in this study" in text


def test_the_gpu_study_where_nothing_fit_resumes_with_the_offload_point(tmp_path: Path) -> None:
    """The H100 study 1 % under full block AC (benchmarks/results/offload33, torch 2.11) as it
    stood after its first 12 trials (tests/data/offload33-lo-12-trials.db): offload never drawn,
    exit 3. Resumed with 6 more trials (fewer than the opening
    needs, but the study's target is 18), its next trial is full block AC with offload on every
    block, at the knobs the study settled."""
    import shutil

    import optuna

    from budgettune.storage.user_attrs import TARGET_ATTR
    from budgettune.study.opening_plan import plan_opening
    from budgettune.study.spec import SearchSpec

    db = tmp_path / "lo.db"
    shutil.copy(Path(__file__).parents[1] / "data/offload33-lo-12-trials.db", db)
    url = f"sqlite:///{db}"
    study = optuna.load_study(study_name="offload33-lo", storage=url)
    study.set_user_attr(TARGET_ATTR, 18)  # as `search --trials 6` sets it before any trial
    search = SearchSpec.from_json_dict(
        study.user_attrs["search_spec"], storage_url=url, num_trials=6
    )
    notices: list[str] = []
    plan_opening(study, search, notices.append)
    [queued] = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert queued.user_attrs["baseline"] == "structured-full-1-offload-1"
    spec = queued.user_attrs["enqueued_spec"]
    assert (spec["block_ac_every"], spec["block_ac_policy"], spec["offload_every"]) == (
        1, "full", 1
    )  # fmt: skip
    assert (spec["optimizer_impl"], spec["cuda_alloc_conf"]) == (
        "fused", "expandable_segments:True"
    )  # fmt: skip
