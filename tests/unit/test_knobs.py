"""Issue 31: a knob is one definition (`budgettune.trial.knobs`). Every knob `TrialSpec`
declares is applied by the job (``load_pinned``, ``pinned.compile``, ``pinned.optimizer``)
and rendered by `show`: a knob defined but not applied or not rendered fails here, with no
change to this file needed for a new knob of a kind the job already applies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._functorch.partitioners as partitioners
from torch import nn

import budgettune.pinning.pinned as pinned_module
import budgettune.trial.recompute as recompute
from budgettune.pinning import load_pinned
from budgettune.pinning.document import SCHEMA_VERSION
from budgettune.present.tables import pin_table
from budgettune.study.space import SearchSpace, parse_fixed
from budgettune.study.study_schema import TABLES
from budgettune.trial.allocator import AllocatorApplied
from budgettune.trial.knobs import Knob
from budgettune.trial.offload import ActivationOffload
from budgettune.trial.spec import KNOBS, TrialSpec

KNOB_LIST = [k for k in KNOBS if k.is_knob]
BASE = TrialSpec(
    compile_backend="aot_eager_decomp_partition", activation_memory_budget=0.5, block_ac_every=1
)
"""A spec where every knob is relevant (compiled, budget below 1, block AC on)."""


class _Stop(Exception):
    """Raised at the partitioner's first look at its op list: what it saw is recorded."""


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _probe(k: Knob, base: TrialSpec) -> Any:
    """A value of ``k`` other than ``base``'s, that the space could try."""
    if k.value_type is float:
        return 0.3
    if k.value_type is tuple:
        return (k.space_default[0],)
    pool = [*k.choices, *(k.space_default_cuda or ()), *k.space_default]
    if k.value_type is int:  # a stride the default space does not list (offload_every)
        pool.append(getattr(base, k.name) + 1)
    return next(v for v in pool if v != getattr(base, k.name))


def _run_job(
    spec: TrialSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, partitioning: bool
) -> dict:
    """Apply a pin of ``spec`` as a job does, one step, and record what torch was asked."""
    seen: dict[str, Any] = {"checkpoint": [], "compile": [], "partition": None, "offload": 0}

    def allocator(conf: str) -> AllocatorApplied:
        seen["allocator"] = conf
        return AllocatorApplied(setting=conf, how="none")

    monkeypatch.setattr(pinned_module, "apply_allocator_settings", allocator)
    real_enter = ActivationOffload.__enter__

    def offload_entered(self: ActivationOffload) -> ActivationOffload:
        seen["offload"] += 1
        return real_enter(self)

    monkeypatch.setattr(ActivationOffload, "__enter__", offload_entered)
    if partitioning:  # the real compile, up to the partitioner's first look at its op list
        monkeypatch.setattr(recompute, "check_spec_supported", lambda spec, device: None)
        original = partitioners.get_default_op_list

        def recorder() -> Any:
            if seen["partition"] is None:
                active = partitioners.get_default_op_list
                seen["partition"] = {
                    "config": {
                        key: getattr(functorch_config, key) for key in recompute._CONFIG_KEYS
                    },
                    "active": active,
                }
                raise _Stop
            return original()

        monkeypatch.setattr(partitioners, "get_default_op_list", recorder)
    else:  # what torch.compile is asked, the model run as it is (checkpoints seen as called)
        real_checkpoint = torch.utils.checkpoint.checkpoint

        def checkpoint(fn: Any, *args: Any, **kwargs: Any) -> Any:
            seen["checkpoint"].append("context_fn" in kwargs)
            return real_checkpoint(fn, *args, **kwargs)

        monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", checkpoint)

        def compile(model: Any, **kwargs: Any) -> Any:
            seen["compile"].append(kwargs)
            return model

        monkeypatch.setattr(torch, "compile", compile)
    torch._dynamo.reset()
    path = tmp_path / "pin.json"
    document = {
        "schema_version": SCHEMA_VERSION,
        "spec": spec.to_json_dict(),
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 10**9,
        "mem_metric": "device",
    }
    path.write_text(json.dumps(document))
    pinned = load_pinned(path, warn=False)
    seen["batch"] = pinned.batch_arguments()  # the job's loader and loop (issue 46)
    model = Tiny()
    compiled = pinned.compile(model, blocks=list(model.blocks))
    optimizer = pinned.optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    try:
        compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()
        optimizer.step()
    except Exception as exc:  # the partitioner stopped at _Stop (dynamo wraps it)
        if seen["partition"] is None:
            raise
        assert "_Stop" in repr(exc) or isinstance(exc, _Stop)
    if seen["partition"] is not None:
        active = seen["partition"].pop("active")
        ops = active().recomputable_ops if active is not partitioners.get_default_op_list else None
        seen["partition"]["ops"] = None if ops is None else sorted(map(str, ops))
    seen["optimizer"] = {k: optimizer.defaults.get(k) for k in ("fused", "foreach")}
    torch._dynamo.reset()
    return seen


@pytest.mark.parametrize("knob", KNOB_LIST, ids=lambda k: k.name)
def test_every_knob_is_applied_by_the_job(
    knob: Knob, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert knob.applied_by in (
        "partitioner",
        "op_list",
        "compile",
        "block_ac",
        "offload",
        "optimizer",
        "allocator",
        "batch",
    ), f"the job has no way to apply {knob.name}"
    if knob.applied_by == "partitioner":
        assert knob.functorch_key in recompute._CONFIG_KEYS
    value = _probe(knob, BASE)
    spec = BASE.replace(**{knob.name: value})
    partitioning = knob.applied_by in ("partitioner", "op_list")
    with monkeypatch.context() as patch:
        before = _run_job(BASE, tmp_path, patch, partitioning=partitioning)
    with monkeypatch.context() as patch:
        after = _run_job(spec, tmp_path, patch, partitioning=partitioning)
    assert before != after, f"the job ran {knob.name}={value!r} as it ran the default"
    if knob.applied_by == "partitioner":
        assert after["partition"]["config"][knob.functorch_key] == value


@pytest.mark.parametrize("knob", KNOB_LIST, ids=lambda k: k.name)
def test_every_knob_is_rendered_in_show_and_named_once(knob: Knob) -> None:
    assert knob.relevant(BASE)
    spec = BASE.replace(**{knob.name: _probe(knob, BASE)})
    if knob.study_wide:
        assert spec.describe_study() != BASE.describe_study()
    else:
        assert spec.describe() != BASE.describe(), f"show renders {knob.name} as its default"
    # One spelling: the field, the [fix] key, the trial flag; the plural for its list.
    assert knob.flag == "--" + knob.name.replace("_", "-")
    if knob.sampled == "choice":
        assert knob.plural in TABLES["space"].model_fields
        assert knob.name in TABLES["fix"].model_fields
        assert getattr(SearchSpace(), knob.plural) == knob.space_default
        assert parse_fixed([f"{knob.name}={_text(_probe(knob, BASE))}"]) == {
            knob.name: _probe(knob, BASE)
        }


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_show_and_the_pin_table_name_the_study_wide_knobs() -> None:
    from rich.console import Console

    from budgettune.pinning.document import PinDocument
    from budgettune.present.report import StudyReport
    from budgettune.present.tables import study_tables

    spec = TrialSpec(compile_backend="aot_eager_decomp_partition")
    figures = {"peak_worst_bytes": 10**8, "peak_median_bytes": 10**8, "step_time_ms": 5.0}
    pin = {
        "spec": spec.to_json_dict(),
        "measured": {**figures, "runs": 1, "peak_phase": "backward"},
        "mem_metric": "device",
        "limit_bytes": 10**9,
        "study_name": "s",
        "trial_number": 0,
        "trials": 1,
    }
    report = StudyReport(
        study_name="s", workload="builtin:tiny-gpt", limit_bytes=10**9, mem_metric="device",
        margin=0.03, baseline_status="ok", rows=(), best=None, pareto=(), pin=None, advice="",
        study_settings=spec.describe_study(),
    )  # fmt: skip
    console = Console(width=400, record=True)
    console.print(pin_table(PinDocument.from_json_dict(pin)))
    for table in study_tables(report):
        console.print(table)
    text = " ".join(console.export_text().split())
    assert text.count("backend aot_eager_decomp_partition") == 2, text


def test_every_trial_spec_field_is_declared_as_a_knob_or_a_step_setting() -> None:
    import dataclasses

    assert [k.name for k in KNOBS] == [f.name for f in dataclasses.fields(TrialSpec)]
    assert {k.name for k in KNOBS if not k.is_knob} == {"seed", "warmup_steps", "timed_steps"}


def test_old_study_keys_and_flags_still_read_as_today_s(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from budgettune.cli import app
    from budgettune.study.study_file import build_search_spec, read_study_file

    old = tmp_path / "old.toml"
    old.write_text(
        'max_mem = "1GB"\ntrials = 3\nstudy = "s"\ntimeout = 60\nreverify = 2\n'
        '[space]\nbudget = [0.2, 0.9]\nsolvers = ["dp"]\nmodes = ["default"]\nac_every = [0, 2]\n'
        'ac_policies = ["full"]\nalloc_confs = [""]\nbackend = "aot_eager_decomp_partition"\n'
        'remove_ops = ["aten.add"]\nadd_ops = ["aten.mm"]\n'
    )
    new = tmp_path / "new.toml"
    new.write_text(
        'max_mem = "1GB"\nnum_trials = 3\nstudy_name = "s"\ntrial_timeout_s = 60\n'
        "reverify_runs = 2\n[space]\nactivation_memory_budget_range = [0.2, 0.9]\n"
        'knapsack_solvers = ["dp"]\ncompile_modes = ["default"]\nblock_ac_every = [0, 2]\n'
        'block_ac_policies = ["full"]\ncuda_alloc_confs = [""]\n'
        'compile_backend = "aot_eager_decomp_partition"\nremovable_ops = ["aten.add"]\n'
        'addable_ops = ["aten.mm"]\n'
    )
    specs = [build_search_spec(read_study_file(path), default_device="cpu") for path in (old, new)]
    assert specs[0] == specs[1]
    assert specs[0].num_trials == 3 and specs[0].space.budget_high == 0.9
    both = tmp_path / "both.toml"
    both.write_text('max_mem = "1GB"\ntrials = 3\nnum_trials = 4\n')
    with pytest.raises(Exception, match="trials and num_trials are the same key"):
        read_study_file(both)
    help_text = CliRunner().invoke(app, ["trial", "--help"], env={"COLUMNS": "200"}).output
    for k in KNOB_LIST:
        assert k.flag in help_text and (k.old_flag is None or k.old_flag in help_text)


def test_a_space_stored_before_a_knob_existed_tries_only_its_default() -> None:
    from budgettune.study.space import LISTED

    stored = SearchSpace.for_device("cpu").to_json_dict()
    for k in LISTED:
        old = {key: value for key, value in stored.items() if key != k.plural}
        values = SearchSpace.from_json_dict(old).lists[k.plural]
        if k.name in ("compile_mode", "knapsack_solver", "runtime_estimator", "block_ac_every",
                      "block_ac_policy", "optimizer_impl", "cuda_alloc_conf",
                      "recompute_ops_removed", "recompute_ops_added"):  # fmt: skip
            assert values == k.space_default  # stored by every budgettune: today's default
        else:  # a knob added since: an old study goes on as it was measured
            assert values == (() if k.sampled == "subset" else (k.default,))


def test_the_docs_knob_table_lists_every_knob_as_it_is_defined() -> None:
    """docs/commands.md's knob table is written by hand: each searched knob has its row, with its
    `trial` flag and its list's name in a search as the definition gives them."""
    import re
    from pathlib import Path

    from budgettune.trial.spec import KNOB_BY_NAME

    readme = (Path(__file__).parents[2] / "docs" / "commands.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"`[a-z_]+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    knobs = {name: knob for name, knob in KNOB_BY_NAME.items() if knob.plural}
    assert set(rows) == set(knobs)
    for name, knob in knobs.items():
        assert rows[name][2].startswith(f"`{knob.flag}`"), (name, rows[name][2])
        assert rows[name][3].startswith(f"`{knob.plural}`"), (name, rows[name][3])
