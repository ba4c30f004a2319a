"""`budgettune export --format torchtitan` (issue 32): a pin as torchtitan job-config TOML.

The keys are those of torchtitan v0.2.2's ``torchtitan/config/job_config.py`` (listed here, so
a key torchtitan does not have fails the test), and one stderr line says what is left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budgettune.cli import app
from budgettune.errors import PinnedConfigError
from budgettune.integrations.torchtitan import torchtitan_config
from budgettune.pinning import parse_pin, write_pin
from budgettune.trial.spec import EXPANDABLE, TrialSpec

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# torchtitan v0.2.2 (73a0e697), torchtitan/config/job_config.py
TORCHTITAN_KEYS = {
    "activation_checkpoint": {
        "mode",
        "selective_ac_option",
        "per_op_sac_force_recompute_mm_shapes_by_fqns",
        "early_stop",
        "memory_budget",
        "visualize_memory_budget_pareto",
        "preserve_rng_state",
        "determinism_check",
        "debug",
    },
    "compile": {"enable", "components", "backend"},
    "optimizer": {
        "name",
        "lr",
        "beta1",
        "beta2",
        "eps",
        "weight_decay",
        "implementation",
        "early_step_in_backward",
    },
}
AC_MODES = {"none", "full", "selective", "memory_budget"}


def _doc(spec: TrialSpec) -> dict:
    return {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "workload": "builtin:llama",
        "limit_bytes": 27_000_000_000,
        "mem_metric": "device",
    }


def _config(**spec: object) -> dict:
    pinned = parse_pin(_doc(TrialSpec(**spec)), source="pin.json")  # type: ignore[arg-type]
    return tomllib.loads(torchtitan_config(pinned).to_toml())


def test_export_prints_torchtitan_toml_and_one_line_of_what_it_cannot_hold(
    tmp_path: Path,
) -> None:
    spec = TrialSpec(
        activation_memory_budget=0.4,
        knapsack_solver="greedy",
        recompute_ops_added=("aten.mm",),
        optimizer_impl="fused",
        cuda_alloc_conf=EXPANDABLE,
    )
    pin = write_pin(tmp_path / "best.json", _doc(spec))
    done = CliRunner().invoke(app, ["export", "--format", "torchtitan", "--pin", str(pin)])
    assert done.exit_code == 0, done.output
    config = tomllib.loads(done.stdout)
    for section, keys in config.items():
        assert set(keys) <= TORCHTITAN_KEYS[section], section
    assert config["activation_checkpoint"] == {"mode": "memory_budget", "memory_budget": 0.4}
    assert config["compile"] == {"enable": True, "backend": "inductor"}
    assert config["optimizer"] == {"implementation": "fused"}
    (note,) = done.stderr.strip().splitlines()
    for left_out in (f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}", "+aten.mm", "solver greedy"):
        assert left_out in note


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"block_ac_every": 1}, {"mode": "full"}),
        ({"block_ac_every": 2}, {"mode": "selective", "selective_ac_option": "2"}),
        (
            {"block_ac_every": 1, "block_ac_policy": "op"},
            {"mode": "selective", "selective_ac_option": "op"},
        ),
        ({"compile_mode": "eager", "activation_memory_budget": 0.3}, {"mode": "none"}),
        ({}, {"mode": "none"}),
    ],
)
def test_block_ac_and_budgets_map_onto_torchtitan_modes(spec: dict, expected: dict) -> None:
    config = _config(**spec)
    assert config["activation_checkpoint"] == expected
    assert config["activation_checkpoint"]["mode"] in AC_MODES
    assert config["compile"]["enable"] is (spec.get("compile_mode") != "eager")


def test_what_torchtitan_cannot_express_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PinnedConfigError, match="one or the other"):
        _config(block_ac_every=1, activation_memory_budget=0.5)
    with pytest.raises(PinnedConfigError, match="one block in 2"):
        _config(block_ac_every=2, block_ac_policy="op")
    with pytest.raises(PinnedConfigError, match="offload of every 2 block"):  # issue 33
        _config(offload_every=2)
    with pytest.raises(PinnedConfigError, match="op_offload"):
        _config(block_ac_every=1, block_ac_policy="op_offload")
    pin = write_pin(
        tmp_path / "both.json", _doc(TrialSpec(block_ac_every=1, activation_memory_budget=0.5))
    )
    done = CliRunner().invoke(app, ["export", "--format", "torchtitan", "--pin", str(pin)])
    assert done.exit_code == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_pin_name_cannot_inject_toml() -> None:
    """Issue 48: the pin's file name went unescaped into the header comment; a name holding a
    newline and ``[job]`` made valid TOML with an injected section."""
    source = 'evil.json\n[job]\ndump_folder = "/tmp/x"\r\n# '
    pinned = parse_pin(_doc(TrialSpec(block_ac_every=1)), source=source)
    text = torchtitan_config(pinned).to_toml()
    parsed = tomllib.loads(text)
    assert "job" not in parsed
    assert text.splitlines()[0].startswith("# budgettune pin evil.json\\n[job]")
