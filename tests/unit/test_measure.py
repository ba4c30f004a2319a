"""measure.py: the CPU recipe returns sane figures; the CUDA recipe's pieces are right."""

from __future__ import annotations

import math

import pytest
import torch
from recompute_models import tiny_lm_workload

from budgettune.trial import devices, measure, recompute
from budgettune.trial.results import PHASES
from budgettune.trial.spec import TrialSpec

CPU = torch.device("cpu")


def _measure(device: torch.device | str = CPU, **knobs):
    torch._dynamo.reset()
    workload = tiny_lm_workload(device, seq=64, batch=8, layers=2)
    spec = TrialSpec(warmup_steps=2, timed_steps=3, **knobs)
    step = recompute.prepare(workload, spec, torch.device(device))
    return measure.measure(step, spec)


def _check_sane(result) -> None:
    assert set(result.phase_peak_bytes) == set(PHASES)
    assert result.peak_allocated_bytes == max(result.phase_peak_bytes.values())
    assert result.phase_peak_bytes[result.peak_phase] == result.peak_allocated_bytes
    assert result.peak_allocated_bytes > result.steady_bytes > 0
    assert all(peak >= result.steady_bytes for peak in result.phase_peak_bytes.values())
    assert 0 < result.step_time_p10_ms <= result.step_time_ms <= result.step_time_p90_ms
    assert result.compile_s > 0
    assert math.isfinite(result.loss) and abs(result.loss - math.log(256)) < 1.0
    assert math.isfinite(result.grad_norm) and result.grad_norm > 0


def test_cpu_measure_compiled_is_sane() -> None:
    result = _measure(compile_backend="aot_eager_decomp_partition")
    _check_sane(result)
    assert result.peak_reserved_bytes == result.peak_device_bytes == result.peak_allocated_bytes
    assert result.peak_phase in ("forward", "backward")
    print("cpu measure, aot_eager budget 1.0:", result)


def test_cpu_measure_sees_block_ac_eagerly() -> None:
    plain = _measure(compile_mode="eager")
    checkpointed = _measure(compile_mode="eager", block_ac_every=1)
    _check_sane(plain)
    _check_sane(checkpointed)
    assert checkpointed.steady_bytes == plain.steady_bytes
    assert checkpointed.loss == plain.loss
    assert checkpointed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    activations = plain.peak_allocated_bytes - plain.steady_bytes
    assert checkpointed.peak_allocated_bytes < plain.peak_allocated_bytes - activations // 4
    print("eager peak", plain.peak_allocated_bytes, "AC", checkpointed.peak_allocated_bytes)


def test_steady_bytes_counts_params_grads_state_and_batch() -> None:
    workload = tiny_lm_workload(layers=1)
    spec = TrialSpec(compile_mode="eager")
    step = recompute.prepare(workload, spec, CPU)
    params = sum(p.numel() * p.element_size() for p in step.model.parameters())
    batch = sum(t.numel() * t.element_size() for t in step.batch)
    assert measure.steady_tensor_bytes(step) == params + batch
    step.run_step()  # AdamW state: exp_avg, exp_avg_sq (+ scalar steps)
    assert measure.steady_tensor_bytes(step) >= 3 * params + batch


def test_global_grad_norm_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "_NORM_CHUNK_NUMEL", 7)  # many chunks per gradient
    params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    for p in params[:2]:
        p.grad = torch.randn_like(p)
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params[:2]]))
    assert measure.global_grad_norm(params) == pytest.approx(float(expected), rel=1e-6)
    assert measure.global_grad_norm([torch.nn.Parameter(torch.ones(2))]) == 0.0


def test_percentiles() -> None:
    assert measure._percentiles_ms([4.0]) == (4.0, 4.0, 4.0)
    median, p10, p90 = measure._percentiles_ms([float(x) for x in range(1, 12)])
    assert (median, p10, p90) == (6.0, 2.0, 10.0)


def test_peak_phase_prefers_the_earliest_on_ties() -> None:
    assert measure._peak_phase({"forward": 5, "backward": 5, "optimizer": 1}) == "forward"
    assert measure._peak_phase({"forward": 1, "backward": 2, "optimizer": 3}) == "optimizer"


def test_nvml_index_respects_cuda_visible_devices() -> None:
    assert devices.nvml_index(1, None) == 1
    assert devices.nvml_index(1, "") == 1
    assert devices.nvml_index(0, "3,1") == 3
    assert devices.nvml_index(1, "3, 1") == 1
    assert devices.nvml_index(0, "GPU-abc,MIG-def") == "GPU-abc"
    with pytest.raises(ValueError):
        devices.nvml_index(2, "0,1")


@pytest.mark.gpu
def test_cuda_measure_is_sane() -> None:
    result = _measure("cuda", compile_backend="aot_eager_decomp_partition")
    _check_sane(result)
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes
    assert result.peak_device_bytes > result.peak_reserved_bytes  # + the CUDA context
    assert torch.cuda.memory_allocated() > 0
    print("cuda measure:", result)


@pytest.mark.gpu
def test_cuda_optimizer_impl_changes_the_optimizer_transient() -> None:
    foreach = _measure("cuda", compile_mode="eager", optimizer_impl="foreach")
    fused = _measure("cuda", compile_mode="eager", optimizer_impl="fused")
    _check_sane(foreach)
    _check_sane(fused)
    assert fused.phase_peak_bytes["optimizer"] <= foreach.phase_peak_bytes["optimizer"]
    print("optimizer peaks: foreach", foreach.phase_peak_bytes, "fused", fused.phase_peak_bytes)
