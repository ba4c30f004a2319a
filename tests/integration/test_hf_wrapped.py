"""Transformers models the way users train them (issue 28): held by their own wrapper module,
with LoRA adapters (`peft`), and sharded with more blocks than dynamo's recompile limit.

The wrapped decoder is `examples/wrapped_decoder.py`. Before the cache switch reached models
inside another module, op-policy block AC failed on it (``aten.slice.Tensor ... encountered
during backward``, transformers 5.24) and both policies on transformers 5.17; per-block compile
of a decoder deeper than 8 layers failed with ``FailOnRecompileLimitHit``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from budgettune.pinning import parse_pin  # noqa: E402
from budgettune.trial import measure, recompute  # noqa: E402
from budgettune.trial.hf_cache import transformers_models  # noqa: E402
from budgettune.trial.launcher import launch_trial  # noqa: E402
from budgettune.trial.results import TrialOutcome  # noqa: E402
from budgettune.trial.spec import TrialSpec  # noqa: E402
from budgettune.trial.trial_run import TrialRun  # noqa: E402
from budgettune.workload import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WRAPPED = f"{ROOT / 'examples' / 'wrapped_decoder.py'}:build"
CPU = torch.device("cpu")
BACKEND = "aot_eager_decomp_partition"
SHAPE = {"tiny": True, "batch_size": 2, "seq_len": 32}
PIN_FIELDS = {"workload": WRAPPED, "limit_bytes": 10**9, "mem_metric": "device"}


def _wrapped(adapter: str) -> object:
    torch._dynamo.reset()  # a fresh trial process has no compiled code to reuse
    torch.manual_seed(0)
    return load_workload(WRAPPED, CPU, {**SHAPE, "adapter": adapter})


def test_a_wrapped_decoder_with_adapters_runs_block_ac_full_and_op() -> None:
    """The user's wrapper around a peft model around the transformers decoder."""
    losses = {}
    for policy in ("full", "op"):
        workload = _wrapped("lora")
        inner = transformers_models(workload.model)
        assert inner and type(workload.model).__name__ == "Finetuner"
        spec = TrialSpec(
            compile_backend=BACKEND,
            block_ac_every=1,
            block_ac_policy=policy,
            warmup_steps=1,
            timed_steps=1,
        )
        step = recompute.prepare(workload, spec, CPU)
        figures = measure.measure(step, spec)
        assert step.model_changes == ("use_cache=False",)
        assert all(model.config.use_cache is False for model in inner)
        losses[policy] = figures.loss
    assert losses["full"] == pytest.approx(losses["op"], rel=1e-4)


def test_the_pin_turns_the_cache_off_inside_the_users_module() -> None:
    workload = _wrapped("none")
    decoder = transformers_models(workload.model)[0]
    assert decoder.config.use_cache
    # the pin says what the trial changed: a budget alone (no block AC) still gets it
    spec = TrialSpec(compile_backend=BACKEND, activation_memory_budget=0.5)
    pin = {
        "schema_version": 1,
        "spec": spec.to_json_dict(),
        "model_changes": ["use_cache=False"],
        **PIN_FIELDS,
    }
    model = parse_pin(pin, source="pin").compile(workload.model)
    assert decoder.config.use_cache is False
    workload.loss(model, workload.batch).backward()


def test_a_pin_from_a_newer_budgettune_is_refused_in_one_line() -> None:
    from budgettune.errors import PinnedConfigError

    pin = {
        "schema_version": 1,
        "spec": TrialSpec(compile_mode="eager").to_json_dict(),
        "model_changes": ["use_cache=False", "attn_implementation=flex"],
        **PIN_FIELDS,
    }
    # refused as the pin is read (issue 48: verify passed it, then compile raised)
    with pytest.raises(PinnedConfigError, match="cannot make: attn_implementation=flex; upgr"):
        parse_pin(pin, source="pin")


@pytest.mark.parametrize(
    "knobs",
    [
        {"activation_memory_budget": 0.5},
        {"block_ac_every": 1, "block_ac_policy": "op"},
    ],
    ids=["budget", "block-ac"],
)
def test_a_sharded_decoder_deeper_than_the_recompile_limit_runs(
    tmp_path: Path, knobs: dict[str, object]
) -> None:
    """2 ranks (gloo, FSDP2, per-block compile in torchtitan's order) of a 10-layer Qwen2:
    more blocks than dynamo's recompile limit of 8."""
    spec = TrialSpec(compile_backend=BACKEND, warmup_steps=1, timed_steps=1, **knobs)
    run = TrialRun(
        spec=spec,
        workload="hf:qwen2",
        workload_options={**SHAPE, "num_hidden_layers": 10},
        nproc_per_node=2,
        collective_timeout_s=120,
    )
    result = launch_trial(run, run_dir=tmp_path, timeout_s=300)
    assert result.outcome is TrialOutcome.OK, result.error
    assert result.model_changes == ("use_cache=False",)
    assert [r.rank for r in result.ranks] == [0, 1]
