"""Choose the winner, write and read the pinned JSON, and apply it in a training job.

    pinned = budgettune.load_pinned("best.json")   # warns when the fingerprint is stale
    model = pinned.compile(model)                  # functorch config scoped, op list, AC, mode
    optimizer = pinned.optimizer(optimizer)        # the pinned optimizer implementation

Torch is imported only when a pin is applied (`PinnedConfig.compile`), never to choose one.
"""

from __future__ import annotations

import datetime
import json
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgettune.errors import PinnedConfigError, SpecError
from budgettune.trial.ranks import memory_split, per_rank_figures, world_size_warning
from budgettune.trial.results import TrialResult, write_json_atomically
from budgettune.trial.spec import TrialSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from budgettune.search.spec import SearchSpec

SCHEMA_VERSION = 1
SHARDING = (
    "fsdp2 under torchrun, torchtitan order: block AC, per-block torch.compile(fullgraph=True), "
    "then the workload's parallelize(model, mesh) or fully_shard per block and at the root"
)
"""The pin's ``sharding`` for a study of several ranks per trial (``none`` for one)."""


class StalePinWarning(UserWarning):
    """The running job differs from the one the pin was measured on (torch, GPU, workload)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A feasible configuration from the trials, before re-verification."""

    trial_number: int
    """The Optuna trial that measured it (the fastest such trial)."""
    spec: TrialSpec
    """The configuration."""
    step_time_ms: float
    """Median step time in that trial."""
    peak_bytes: int
    """Peak on the search's memory metric in that trial."""


def margin_violation_bytes(peak_bytes: float, *, limit_bytes: int, margin: float) -> float:
    """How far ``peak × (1 + margin)`` is over the limit (≤ 0: it fits).

    The one notion of "fits": the search's Optuna constraint, the candidates, `show`, the
    dashboard and the pin all use it. The margin absorbs run-to-run variation of the peak, so
    a configuration the search rewards is one the pin will accept.
    """
    return peak_bytes * (1.0 + margin) - limit_bytes


def fits_limit(peak_bytes: float, *, limit_bytes: int, margin: float) -> bool:
    """``peak × (1 + margin) ≤ limit`` (see `margin_violation_bytes`)."""
    return margin_violation_bytes(peak_bytes, limit_bytes=limit_bytes, margin=margin) <= 0


#: The allocator's reserved peak above its allocated peak that is worth a word: past this
#: fraction of the allocated peak, fragmentation decides whether a configuration fits.
RESERVED_GAP_FRACTION = 0.15


def allocator_advice(
    *, peak_allocated_bytes: int, peak_reserved_bytes: int, mem_metric: str, alloc_conf: str
) -> str:
    """What to say when the binding peak is the allocator's reserve, far above what was used.

    Only for the ``reserved`` and ``device`` metrics (the allocated peak has no such gap) and
    only when expandable segments are not already on.
    """
    if mem_metric == "allocated" or "expandable_segments:True" in alloc_conf:
        return ""
    gap = peak_reserved_bytes - peak_allocated_bytes
    if peak_allocated_bytes <= 0 or gap <= RESERVED_GAP_FRACTION * peak_allocated_bytes:
        return ""
    return (
        f"the allocator reserved {gap / 1e9:.2f} GB above the {peak_allocated_bytes / 1e9:.2f} "
        "GB allocated (fragmentation), and the limit is checked against that reserve; "
        "cuda_alloc_conf=expandable_segments:True usually closes the gap (the search tries it "
        "on CUDA: --alloc-confs default,expandable_segments:True)"
    )


def phase_advice(peak_phase: str | None) -> str:
    """What to say when the peak sits in a phase recompute cannot lower."""
    if peak_phase == "optimizer":
        return (
            "the peak is set in the optimizer step, which recompute cannot lower; "
            "try the optimizer knob (optimizer_impl=fused or foreach)"
        )
    return ""


def choose_pin(
    candidates: Sequence[Candidate],
    reverified: Mapping[int, Sequence[TrialResult]],
    *,
    limit_bytes: int,
    mem_metric: str,
    margin: float,
) -> tuple[Candidate, list[TrialResult]] | None:
    """The fastest candidate whose *worst* re-measured peak, plus the margin, fits the limit.

    A candidate qualifies only if every re-measurement ended ``ok``. Speed is the median of
    the re-measured step times.

    Returns:
        The winner and its re-measurements, or None when none qualifies.
    """
    qualified: list[tuple[float, Candidate, list[TrialResult]]] = []
    for candidate in candidates:
        results = list(reverified.get(candidate.trial_number, ()))
        if not results or not all(r.outcome.is_feasible() and r.measurement for r in results):
            continue
        worst = max(r.measurement.peak_bytes(mem_metric) for r in results if r.measurement)
        if not fits_limit(worst, limit_bytes=limit_bytes, margin=margin):
            continue
        median_ms = statistics.median(r.measurement.step_time_ms for r in results if r.measurement)
        qualified.append((median_ms, candidate, results))
    if not qualified:
        return None
    _, candidate, results = min(qualified, key=lambda item: item[0])
    return candidate, results


def _figures(results: Sequence[TrialResult], metric: str) -> dict[str, Any]:
    measurements = [r.measurement for r in results if r.measurement is not None]
    peaks = [m.peak_bytes(metric) for m in measurements]
    times = [m.step_time_ms for m in measurements]
    last = measurements[-1]
    return {
        "runs": len(measurements),
        "peak_median_bytes": int(statistics.median(peaks)),
        "peak_worst_bytes": max(peaks),
        "peak_device_worst_bytes": max(m.peak_device_bytes for m in measurements),
        "peak_reserved_worst_bytes": max(m.peak_reserved_bytes for m in measurements),
        "peak_allocated_worst_bytes": max(m.peak_allocated_bytes for m in measurements),
        "step_time_ms": statistics.median(times),
        "step_time_worst_ms": max(times),
        "steady_bytes": last.steady_bytes,
        "peak_phase": last.peak_phase,
        "phase_peak_bytes": dict(last.phase_peak_bytes),
    }


def reference_figures(
    attrs: Mapping[str, Any] | None,
    remeasured: Sequence[TrialResult],
    *,
    mem_metric: str,
    pin_step_time_ms: float,
) -> dict[str, Any] | None:
    """A reference configuration in the pin (the unconstrained baseline, or full block AC).

    Args:
        attrs: user attrs of the reference's trial (None: it was not measured).
        remeasured: its fresh re-measurements; when some succeeded, its step time is their
            median (``runs`` says how many), like the pin's, and the trial's own figure stays
            as ``trial_step_time_ms``; else the trial's figure is used.
        mem_metric: the search's memory metric.
        pin_step_time_ms: the pin's median step time, for ``slowdown``.
    """
    if attrs is None:
        return None
    runs = [r.measurement for r in remeasured if r.measurement is not None]
    step_ms = statistics.median(m.step_time_ms for m in runs) if runs else attrs["step_time_ms"]
    return {
        "spec": attrs["spec"],
        "peak_bytes": attrs[f"peak_{mem_metric}_bytes"],
        "peak_device_bytes": attrs["peak_device_bytes"],
        "step_time_ms": step_ms,
        "runs": len(runs),
        "trial_step_time_ms": attrs["step_time_ms"],
        "peak_phase": attrs.get("peak_phase"),
        "slowdown": pin_step_time_ms / step_ms - 1.0,
    }


def build_pin(
    *,
    search: SearchSpec,
    candidate: Candidate,
    reverify_results: Sequence[TrialResult],
    baseline: Mapping[str, Any] | None,
    trials: int,
    baseline_results: Sequence[TrialResult] = (),
    baseline_status: str = "ok",
    full_ac: Mapping[str, Any] | None = None,
    full_ac_results: Sequence[TrialResult] = (),
    op_sac: Mapping[str, Any] | None = None,
    op_sac_results: Sequence[TrialResult] = (),
) -> dict[str, Any]:
    """The pinned-config document (schema version 1, DESIGN.md §3).

    Args:
        baseline: user attrs of the unconstrained baseline's trial (None: not measured).
        baseline_results: fresh re-measurements of that baseline (see `reference_figures`).
        baseline_status: ``ok``, ``over_limit`` (measured, but it does not fit), or the
            outcome that kept it from being measured (``oom``, ``crashed``...).
        full_ac: user attrs of the full block AC baseline's trial, given when the unconstrained
            baseline cannot be run under the limit: then full AC is the user's real
            alternative, and the pin's slowdown against it is reported as ``full_ac``.
        full_ac_results: its fresh re-measurements.
        op_sac: user attrs of torchtitan's op SAC baseline (sharded studies), with ``fits``.
        op_sac_results: its fresh re-measurements.
    """
    measured = _figures(reverify_results, search.mem_metric)
    first = reverify_results[0]
    baseline_doc = reference_figures(
        baseline,
        baseline_results,
        mem_metric=search.mem_metric,
        pin_step_time_ms=measured["step_time_ms"],
    )
    full_ac_doc = reference_figures(
        full_ac,
        full_ac_results,
        mem_metric=search.mem_metric,
        pin_step_time_ms=measured["step_time_ms"],
    )
    op_sac_doc = reference_figures(
        op_sac,
        op_sac_results,
        mem_metric=search.mem_metric,
        pin_step_time_ms=measured["step_time_ms"],
    )
    if op_sac_doc is not None:
        op_sac_doc["fits"] = fits_limit(
            op_sac_doc["peak_bytes"], limit_bytes=search.max_mem_bytes, margin=search.margin
        )
    if search.nproc_per_node > 1:
        measured["per_rank"] = per_rank_figures(reverify_results, search.mem_metric)
        measured["split"] = memory_split(measured["per_rank"])
    advice = [
        phase_advice(measured["peak_phase"]),
        allocator_advice(
            peak_allocated_bytes=measured["peak_allocated_worst_bytes"],
            peak_reserved_bytes=measured["peak_reserved_worst_bytes"],
            mem_metric=search.mem_metric,
            alloc_conf=candidate.spec.cuda_alloc_conf,
        ),
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "study_name": search.study_name,
        "trial_number": candidate.trial_number,
        "trials": trials,
        "workload": search.workload,
        "workload_options": dict(search.workload_options),
        "device": search.device,
        "spec": candidate.spec.to_json_dict(),
        # What the trials changed in the model besides the knobs; `compile` does it again.
        "model_changes": list(first.model_changes),
        "limit_bytes": search.max_mem_bytes,
        "mem_metric": search.mem_metric,
        "margin": search.margin,
        "measured": measured,
        "advice": "; ".join(a for a in advice if a),
        "baseline": baseline_doc,
        "baseline_status": baseline_status,
        "full_ac": full_ac_doc,
        "op_sac": op_sac_doc,
        "world_size": search.nproc_per_node,
        "sharding": SHARDING if search.nproc_per_node > 1 else "none",
        "fingerprint": {
            "torch_version": first.torch_version,
            "cuda_version": first.cuda_version,
            "device_name": first.device_name,
            "workload": dict(first.workload_fingerprint or {}),
        },
    }


def write_pin(path: str | Path, pin: Mapping[str, Any]) -> Path:
    """Write the pinned JSON atomically; returns the path written."""
    target = Path(path)
    write_json_atomically(target, pin)
    return target


@dataclass(frozen=True, kw_only=True, slots=True)
class PinnedConfig:
    """A pinned configuration, ready to apply to a model in a training job."""

    spec: TrialSpec
    """The pinned knobs."""
    document: Mapping[str, Any] = field(repr=False)
    """The whole pinned JSON."""
    path: str = ""
    """Where it was read from."""

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """torch/CUDA versions, device name and workload fingerprint of the measured job."""
        return self.document.get("fingerprint", {})

    def stale_reasons(self, *, device: torch.device | str | None = None) -> list[str]:
        """How the running process differs from the measured one (empty when it matches)."""
        import torch

        reasons = []
        expected = self.fingerprint
        if expected.get("torch_version") and expected["torch_version"] != torch.__version__:
            reasons.append(f"torch {torch.__version__} (pinned on {expected['torch_version']})")
        running_cuda = torch.version.cuda or "none"
        pinned_cuda = expected.get("cuda_version") or "none"
        if running_cuda != pinned_cuda:
            reasons.append(f"CUDA {running_cuda} (pinned on {pinned_cuda})")
        pinned_device = str(expected.get("device_name", ""))
        if pinned_device and not pinned_device.startswith("cpu") and torch.cuda.is_available():
            name = torch.cuda.get_device_name(torch.device(device) if device else None)
            if name != pinned_device:
                reasons.append(f"GPU {name} (pinned on {pinned_device})")
        return reasons

    def check_workload(self, workload_fingerprint: Mapping[str, Any]) -> list[str]:
        """Compare a `workload.fingerprint(...).to_json_dict()` with the pinned one."""
        expected = self.fingerprint.get("workload") or {}
        if expected and expected.get("digest") != workload_fingerprint.get("digest"):
            return [
                f"workload {workload_fingerprint.get('param_count')} params, batch "
                f"{workload_fingerprint.get('batch')} (pinned on {expected.get('param_count')} "
                f"params, batch {expected.get('batch')})"
            ]
        return []

    def compile(
        self,
        model: nn.Module,
        *,
        blocks: Sequence[nn.Module] | None = None,
        mesh: Any = None,
        parallelize: Any = None,
    ) -> nn.Module:
        """Apply the pin: block AC on ``blocks`` (found if omitted), then compile with the
        partitioner settings scoped to the model's calls (never set globally).

        A pin measured sharded (``world_size`` > 1), applied in a job under torchrun with the
        process group initialised (or given a ``mesh``), is applied as its trials were, on this
        rank: block AC, per-block ``torch.compile(fullgraph=True)``, then ``parallelize(model,
        mesh)`` or `fully_shard` per block and at the root; call it on every rank, before
        building the optimizer.

        Warns with `StalePinWarning` when the parameter count differs from the pinned workload,
        or the job's world size from the pin's (with the measured split of the peak).
        """
        from budgettune.blocks import find_blocks
        from budgettune.trial.recompute import apply_to_model

        expected = (self.fingerprint.get("workload") or {}).get("param_count")
        count = sum(p.numel() for p in model.parameters())
        if expected and expected != count:
            warnings.warn(
                f"pinned config {self.path or ''} was measured on a model with {expected} "
                f"parameters, this one has {count}: re-run budgettune search",
                StalePinWarning,
                stacklevel=2,
            )
        if blocks is None and self.spec.block_ac_every:
            blocks = find_blocks(model)
        pinned_world = int(self.document.get("world_size", 1))
        from budgettune.trial.distributed import sharded_mesh, world_size_from_env

        running_world = world_size_from_env()
        if running_world != pinned_world:
            split = (self.document.get("measured") or {}).get("split")
            text = world_size_warning(
                pinned_world=pinned_world, running_world=running_world, split=split
            )
            warnings.warn(
                f"pinned config {self.path or ''}: {text}", StalePinWarning, stacklevel=2
            )
        mesh = mesh if mesh is not None else sharded_mesh(model, pinned_world, running_world)
        if mesh is not None:
            from budgettune.trial.distributed import apply_sharded

            return apply_sharded(model, self.spec, mesh, blocks=blocks, parallelize=parallelize)
        return apply_to_model(model, self.spec, blocks)

    def optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The same optimizer rebuilt with the pinned implementation flag (as written: itself)."""
        from budgettune.trial.optimizers import rebuild_optimizer

        return rebuild_optimizer(optimizer, self.spec.optimizer_impl)


def parse_pin(data: Any, *, source: str = "") -> PinnedConfig:
    """Validate a pinned document.

    Raises:
        PinnedConfigError: wrong schema version or an invalid spec.
    """
    if not isinstance(data, dict):
        raise PinnedConfigError(f"{source}: a pinned config is a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PinnedConfigError(
            f"{source}: pinned config schema version {version!r} is not supported "
            f"(this budgettune reads version {SCHEMA_VERSION}); re-export it with "
            "`budgettune export` from a matching budgettune"
        )
    try:
        spec = TrialSpec.from_json_dict(data["spec"])
    except (KeyError, TypeError, SpecError) as exc:
        raise PinnedConfigError(f"{source}: invalid pinned spec: {exc}") from None
    return PinnedConfig(spec=spec, document=data, path=source)


def load_pinned(path: str | Path, *, warn: bool = True) -> PinnedConfig:
    """Read a pinned config JSON; warn (`StalePinWarning`) when torch, CUDA or the GPU differ.

    Raises:
        PinnedConfigError: a missing, corrupt or other-schema file.
    """
    source = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PinnedConfigError(f"{source}: no such pinned config") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PinnedConfigError(f"{source}: not a readable pinned config JSON ({exc})") from None
    pinned = parse_pin(data, source=source)
    if warn:
        reasons = pinned.stale_reasons()
        if reasons:
            warnings.warn(
                f"pinned config {source} was measured elsewhere: running on "
                + "; ".join(reasons)
                + ". Its memory figures may not hold: re-run `budgettune verify` or search",
                StalePinWarning,
                stacklevel=2,
            )
    return pinned
