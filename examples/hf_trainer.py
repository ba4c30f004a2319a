"""A transformers `Trainer` with budgettune: search its model and batch, then train with the pin.

    python examples/hf_trainer.py workload trainer_workload    # the Trainer's model and batch
    budgettune search --workload trainer_workload/build.py:build --max-mem 120MB \\
        --backend aot_eager_decomp_partition --trials 6 --output best.json
    python examples/hf_trainer.py train best.json              # the Trainer, the pin applied

The model is a tiny Llama built from its config (a real job would load one with
`from_pretrained`); on a GPU drop ``use_cpu=True``.
"""

from __future__ import annotations

import sys
import tempfile
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import Trainer


def make_trainer(output_dir: str, callbacks: list[Any] | None = None, steps: int = 3) -> Trainer:
    """A tiny Llama and a synthetic dataset in a CPU `Trainer`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, config.vocab_size, (16, 32))
    # `row` is a column the model does not take: the Trainer drops it, by forward's signature
    data = [{"input_ids": row, "labels": row, "row": i} for i, row in enumerate(tokens)]
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)


def write(folder: str) -> str:
    """Write the Trainer's model and first batch as a workload; returns its reference."""
    from budgettune.integrations.transformers import write_workload

    with tempfile.TemporaryDirectory() as output_dir:
        return str(write_workload(make_trainer(output_dir), folder))


def train(pin_path: str, output_dir: str, steps: int = 3) -> Trainer:
    """Train with the pin applied; returns the Trainer."""
    from budgettune.integrations.transformers import PinCallback

    pin = PinCallback(pin_path)  # first: the allocator setting, before anything touches CUDA
    trainer = make_trainer(output_dir, callbacks=[pin], steps=steps)
    trainer.train()
    return trainer


if __name__ == "__main__":
    command, path = sys.argv[1], sys.argv[2]
    if command == "workload":
        print(f"budgettune search --workload {write(path)} --max-mem 120MB")
    else:
        with tempfile.TemporaryDirectory() as out:
            done = train(path, out)
        losses = [entry["loss"] for entry in done.state.log_history if "loss" in entry]
        print("losses:", ", ".join(f"{loss:.4f}" for loss in losses))
