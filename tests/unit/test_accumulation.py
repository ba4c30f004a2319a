"""Issue 46: a trial at a micro-batch with gradient accumulation measures what the job runs:
the passes after the first hold the gradients (the peak across them), the passes and the
optimizer step are timed apart, and the micro-batch is the builder's ``batch_size``."""

from __future__ import annotations

import pytest
import torch
from recompute_models import tiny_lm_workload

from budgettune.errors import SpecError, WorkloadError
from budgettune.trial import measure, recompute
from budgettune.trial.accumulation import batch_rows
from budgettune.trial.child import workload_options
from budgettune.trial.results import Measurement
from budgettune.trial.spec import TrialSpec
from budgettune.trial.trial_run import TrialRun
from budgettune.workload import load_workload

CPU = torch.device("cpu")


def _measured(accum_steps: int) -> tuple[Measurement, int]:
    torch.manual_seed(0)
    workload = tiny_lm_workload(layers=1, batch=2)
    spec = TrialSpec(compile_mode="eager", accum_steps=accum_steps, warmup_steps=1, timed_steps=2)
    step = recompute.prepare(workload, spec, CPU)
    grads = sum(p.numel() * p.element_size() for p in step.model.parameters())
    return measure.measure(step, spec), grads


def test_the_passes_after_the_first_hold_the_gradients_and_are_timed_apart() -> None:
    one, grads = _measured(1)
    three, _ = _measured(3)
    # the second and third passes run with every gradient already there: the forward's peak
    # rises by the gradients' bytes, which one pass never holds in its forward
    assert three.phase_peak_bytes["forward"] - one.phase_peak_bytes["forward"] >= grads
    assert three.peak_device_bytes > one.peak_device_bytes
    assert three.steady_bytes == one.steady_bytes  # between steps: no gradients
    # one pass is timed whole; three are timed apart from the optimizer step
    assert one.forward_backward_ms is None and one.optimizer_ms is None
    assert three.forward_backward_ms is not None and three.optimizer_ms is not None
    assert three.step_time_ms == pytest.approx(3 * three.forward_backward_ms + three.optimizer_ms)
    # the first pass's loss and gradient norm: the same whatever follows it
    assert three.loss == pytest.approx(one.loss)
    assert three.grad_norm == pytest.approx(one.grad_norm)


def test_tokens_are_counted_for_a_batch_of_token_ids_only() -> None:
    from budgettune.trial.accumulation import batch_tokens

    ids = torch.zeros(4, 32, dtype=torch.long)
    assert batch_tokens((ids, ids)) == 128 and batch_rows((ids, ids)) == 4
    assert batch_tokens({"pixel_values": torch.zeros(4, 3, 8, 8)}) == 0  # images
    assert batch_tokens(torch.zeros(4, 32)) == 0  # features, not ids


def test_the_micro_batch_is_the_builders_batch_size() -> None:
    run = TrialRun(
        spec=TrialSpec(micro_batch=3),
        workload="builtin:tiny-gpt",
        workload_options={"batch_size": 8, "n_layers": 1},
    )
    options = workload_options(run)
    assert options == {"batch_size": 3, "n_layers": 1}
    workload = load_workload(run.workload, CPU, options)
    assert batch_rows(workload.batch) == 3
    # 0: the workload's own batch, as written
    assert workload_options(TrialRun(spec=TrialSpec(), workload="builtin:tiny-gpt")) == {}


def test_a_builder_without_batch_size_is_refused_naming_the_option(tmp_path) -> None:
    (tmp_path / "nobatch.py").write_text(
        "import torch\n"
        "from budgettune import Workload\n"
        "def build(device):\n"
        "    model = torch.nn.Linear(4, 4).to(device)\n"
        "    return Workload(model=model, batch=torch.ones(2, 4),\n"
        "        loss=lambda m, b: m(b).sum(),\n"
        "        optimizer=lambda p: torch.optim.SGD(p, lr=0.1))\n"
    )
    run = TrialRun(spec=TrialSpec(micro_batch=4), workload=f"{tmp_path / 'nobatch.py'}:build")
    with pytest.raises(WorkloadError, match="has no option.*batch_size"):
        load_workload(run.workload, CPU, workload_options(run))


@pytest.mark.parametrize("accum_steps", [0, 10**6])
def test_accumulation_steps_are_bounded(accum_steps: int) -> None:
    with pytest.raises(SpecError, match="accum_steps must be from 1 to"):
        TrialSpec(accum_steps=accum_steps)


def test_a_trials_table_says_the_passes_and_the_samples_per_second() -> None:
    import dataclasses
    import io

    from rich.console import Console

    from budgettune.present.tables import result_table
    from budgettune.trial.results import TrialOutcome, TrialResult

    measured, _ = _measured(3)
    measured = dataclasses.replace(measured, samples_per_step=6)
    spec = TrialSpec(micro_batch=2, accum_steps=3)
    out = io.StringIO()
    Console(file=out, width=200).print(
        result_table(TrialResult(outcome=TrialOutcome.OK, measurement=measured), spec=spec)
    )
    text = out.getvalue()
    assert "3 passes of" in text and "(2 rows each)" in text and "optimizer step" in text
    assert f"{6e3 / measured.step_time_ms:.1f} (6 a step)" in text


def test_the_pin_table_and_the_dashboard_note_give_the_pins_samples_per_second() -> None:
    import io

    from rich.console import Console

    from budgettune.pinning.pinned import parse_pin
    from budgettune.present.dashboard_views import study_note
    from budgettune.present.tables import pin_table

    document = {
        "schema_version": 1,
        "spec": {"micro_batch": 4, "accum_steps": 4},
        "workload": "builtin:tiny-gpt",
        "limit_bytes": 125_000_000,
        "mem_metric": "device",
        "trial_number": 3,
        "measured": {"runs": 1, "peak_worst_bytes": 80_000_000, "step_time_ms": 250.0},
    }
    pin = parse_pin(document, source="pin.json").pin
    said = "64.0 (4 a pass x 4 accumulated = 16 a step)"
    out = io.StringIO()
    Console(file=out, width=200).print(pin_table(pin))
    assert said in out.getvalue()
    note = study_note(study_name="s", search={}, points=[], num_failed=0, pin=pin)
    assert f"| samples/s | {said} |" in note
    # a batch of token ids (the fingerprint's first tensor rows x sequence): tokens/s too
    document["fingerprint"] = {"workload": {"batch": ["int64[4, 100]", "int64[4, 100]"]}}
    pin = parse_pin(document, source="pin.json").pin
    note = study_note(study_name="s", search={}, points=[], num_failed=0, pin=pin)
    assert f"| samples/s | {said}, 6,400 tokens/s |" in note  # 4 x 100 x 4 in 250 ms


def test_passes_and_the_optimizer_step_are_paired_with_their_own_marks() -> None:
    """The clock is marked between passes and settled once a step (on CUDA: events, one
    synchronize at the step's end, so the host never waits between passes)."""
    from types import SimpleNamespace

    from budgettune.trial.accumulation import timed_apart

    now = [0.0]
    settled: list[float] = []

    class FakeClock:
        def mark(self) -> float:
            return now[0]

        def settle(self, last: float) -> None:
            settled.append(last)

        def ms(self, start: float, end: float) -> float:
            return end - start

    def advance(by: float):  # noqa: ANN202
        return lambda: now.__setitem__(0, now[0] + by)

    step = SimpleNamespace(
        spec=TrialSpec(accum_steps=3), forward_backward=advance(2.0), optimizer_step=advance(5.0)
    )
    times, split = timed_apart(step, 2, FakeClock())  # type: ignore[arg-type]
    assert split == (2.0, 5.0) and times == [11.0, 11.0]
    assert settled == [11.0, 22.0]  # once a step, at its end
