"""Issue 47: ``--target torchtitan`` keeps a search to what torchtitan's job config expresses,
so that ``export --format torchtitan`` writes its pin (block AC and a budget together, or the
op policy on every k-th block, were exit 2 there)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import UsageError
from budgettune.integrations.torchtitan import inexpressible
from budgettune.study.expressible import keeps, narrowed_for, suggest_for_target
from budgettune.study.space import SearchSpace
from budgettune.study.spec import SearchSpec
from budgettune.trial.spec import TrialSpec

SPACE = SearchSpace.for_device(
    "cuda", block_ac_every=(0, 1, 2, 4), block_ac_policies=("full", "op")
)


def test_the_space_is_narrowed_to_what_the_config_holds() -> None:
    narrowed = narrowed_for(SPACE, "torchtitan")
    assert narrowed.removable_ops == () and narrowed.addable_ops == ()
    assert narrowed.knapsack_solvers == ("dp",) and narrowed.runtime_estimators == ("flops",)
    assert narrowed.compile_scopes == ("blocks",) and narrowed.offload_every == (0,)
    assert narrowed.block_ac_every == (0, 1, 2, 4)  # kept: the mode draw keeps them apart
    assert narrowed_for(SPACE, "") is SPACE
    with pytest.raises(UsageError, match="cannot hold knapsack_solver=greedy"):
        narrowed_for(SPACE.replace(fixed={"knapsack_solver": "greedy"}), "torchtitan")
    both = {"block_ac_every": 2, "activation_memory_budget": 0.5}
    with pytest.raises(UsageError, match="not both"):
        narrowed_for(SPACE.replace(fixed=both), "torchtitan")


def test_every_draw_is_one_torchtitan_expresses_and_every_mode_is_drawn() -> None:
    space = narrowed_for(SPACE, "torchtitan")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(80):
        trial = study.ask()
        spec = suggest_for_target(trial, space, TrialSpec(), space, "torchtitan")
        assert inexpressible(spec) is None, spec.describe()
        assert spec.compile_scope == "blocks" and not spec.recompute_ops_removed
        seen.add((spec.block_ac_every, spec.block_ac_policy if spec.block_ac_every else "-"))
        seen.add(("budget", spec.activation_memory_budget < 1.0 and not spec.block_ac_every))
        study.tell(trial, 1.0)
    assert {(0, "-"), (1, "full"), (2, "full"), (4, "full"), (1, "op")} <= seen
    assert ("budget", True) in seen  # torchtitan's memory_budget mode
    assert (2, "op") not in seen and (4, "op") not in seen


def test_keeps_is_the_exporters_rule() -> None:
    assert keeps(TrialSpec(block_ac_every=2, activation_memory_budget=0.4), "")
    assert not keeps(TrialSpec(block_ac_every=2, activation_memory_budget=0.4), "torchtitan")
    assert not keeps(TrialSpec(block_ac_every=2, block_ac_policy="op"), "torchtitan")
    assert keeps(TrialSpec(block_ac_every=1, block_ac_policy="op"), "torchtitan")
    assert keeps(TrialSpec(activation_memory_budget=0.3), "torchtitan")


def test_an_unknown_target_is_one_line() -> None:
    with pytest.raises(UsageError, match="unknown target 'deepspeed'"):
        SearchSpec(
            workload="builtin:tiny-gpt", device="cpu", max_mem_bytes=10**9, study_name="s",
            space=SearchSpace.for_device("cpu"), target="deepspeed",
        )  # fmt: skip


def test_a_torchtitan_search_pins_what_export_writes(tmp_path: Path) -> None:
    db, pin = tmp_path / "bt.db", tmp_path / "pin.json"
    result = CliRunner().invoke(
        app,
        [
            "search", "-w", "builtin:tiny-gpt", "-o", "n_layers=2", "--device", "cpu",
            "--max-mem", "1GB", "--target", "torchtitan", "--num-trials", "3",
            "--compile-backend", "aot_eager_decomp_partition", "--block-ac-every", "0,1",
            "--warmup-steps", "1", "--timed-steps", "1", "--top-k", "1", "--reverify-runs", "1",
            "--storage", str(db), "--runs-dir", str(tmp_path / "runs"), "--output", str(pin),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    for trial in study.trials:
        spec = TrialSpec.from_json_dict(trial.user_attrs["spec"])
        assert inexpressible(spec) is None and spec.compile_scope == "blocks", spec.describe()
    exported = CliRunner().invoke(app, ["export", "--format", "torchtitan", "--pin", str(pin)])
    assert exported.exit_code == 0, exported.output
    assert "[activation_checkpoint]" in exported.stdout
    assert json.loads(pin.read_text())["spec"]["compile_scope"] == "blocks"
