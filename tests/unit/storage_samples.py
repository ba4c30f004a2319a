"""Real `TrialResult`s and fingerprints shared by the storage tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

FINGERPRINT: dict[str, Any] = {
    "param_count": 1_234_567,
    "param_bytes": 4_938_268,
    "batch": ["int64[4, 128]", "int64[4, 128]"],
    "digest": "sha256:0f1e2d",
}
SPEC = TrialSpec(
    activation_memory_budget=0.3,
    recompute_ops_added=("aten.mm",),
    compile_backend="aot_eager_decomp_partition",
    optimizer_impl="fused",
)


def pin_document(spec: TrialSpec) -> dict[str, Any]:
    """The least pinned document a reader takes: ``spec`` for the built-in tiny GPT under 1 GB
    of device memory, no figures."""
    return {
        "schema_version": 1, "spec": spec.to_json_dict(), "workload": "builtin:tiny-gpt",
        "limit_bytes": 10**9, "mem_metric": "device",
    }  # fmt: skip


def ok_result(*, loss: float = 2.5) -> TrialResult:
    return TrialResult(
        outcome=TrialOutcome.OK,
        measurement=Measurement(
            peak_allocated_bytes=13_110_000_000,
            peak_reserved_bytes=13_500_000_000,
            peak_device_bytes=14_050_000_000,
            steady_bytes=9_000_000_000,
            phase_peak_bytes={"forward": 11_000, "backward": 13_110, "optimizer": 12_000},
            peak_phase="backward",
            step_time_ms=62.9,
            step_time_p10_ms=62.1,
            step_time_p90_ms=64.0,
            compile_s=25.5,
            loss=loss,
            grad_norm=1.75,
        ),
        device_name="NVIDIA H200",
        torch_version="2.11.0",
        cuda_version="12.8",
        log_path="/runs/trial-3.log",
        wall_s=41.0,
        workload_fingerprint=FINGERPRINT,
    )


def crashed_result() -> TrialResult:
    return TrialResult(
        outcome=TrialOutcome.CRASHED,
        error="device-side assert triggered",
        device_name="NVIDIA H200",
        torch_version="2.11.0",
        log_path="/runs/trial-4.log",
        wall_s=3.0,
    )


def run_result(peak: int, ms: float, *, cold: bool = False) -> TrialResult:
    """An ``ok`` trial (or fresh run) that peaked at ``peak`` bytes on every metric in
    ``ms`` ms a step."""
    return TrialResult(
        outcome=TrialOutcome.OK,
        cold_caches=cold,
        measurement=Measurement(
            peak_allocated_bytes=peak,
            peak_reserved_bytes=peak,
            peak_device_bytes=peak,
            steady_bytes=1,
            phase_peak_bytes={"backward": peak},
            peak_phase="backward",
            step_time_ms=ms,
            step_time_p10_ms=ms,
            step_time_p90_ms=ms,
            compile_s=0.0,
            loss=1.0,
            grad_norm=1.0,
        ),
    )


def small_study(path: Path, study_attrs: Mapping[str, Any]) -> Path:
    """A SQLite study ``s`` at ``path`` with one finished trial, made as budgettune makes its
    storage (no trial run): the hostile tests edit its rows by hand."""
    import optuna

    from budgettune import storage as storage_mod

    store = storage_mod.open_storage(f"sqlite:///{path}")
    study = optuna.create_study(study_name="s", storage=store.optuna_storage)
    for key, value in study_attrs.items():
        study.set_user_attr(key, value)
    trial = study.ask({"activation_memory_budget": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("spec", {"activation_memory_budget": 0.5})
    trial.set_user_attr("step_time_ms", 12.5)
    trial.set_user_attr("outcome", "ok")
    study._storage.set_trial_system_attr(trial._trial_id, "constraints", [-1.0])
    study.tell(trial, 12.5)
    return path


def measured_trial(
    number: int,
    spec: TrialSpec,
    *,
    fits: bool,
    ms: float,
    label: str | None = None,
    peaks: tuple[int, int] = (90, 200),
) -> Any:
    """A finished trial as a search stores it: ``ok``, ``ms`` a step, at the first of
    ``peaks`` (fits: COMPLETE) or the second (does not: PRUNED), a baseline where ``label``
    names one."""
    import optuna

    peak = peaks[0] if fits else peaks[1]
    attrs: dict[str, Any] = {
        "outcome": "ok",
        "spec": spec.to_json_dict(),
        "peak_device_bytes": peak,
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": peak,
        "step_time_ms": ms,
        "constraint": [-1.0 if fits else 1.0],
    }
    if label is not None:
        attrs["baseline"] = label
    state = optuna.trial.TrialState.COMPLETE if fits else optuna.trial.TrialState.PRUNED
    made = optuna.trial.create_trial(value=ms, user_attrs=attrs, state=state)
    made.number = number
    return made
