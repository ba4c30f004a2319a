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
