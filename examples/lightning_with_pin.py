"""A Lightning `Trainer` that applies a budgettune pin with one callback.

    python examples/lightning_with_pin.py best.json

The `LightningModule` holds a tiny Llama built from its config in ``self.model`` (a real job
would load one with `from_pretrained`); ``PinCallback(..., module="model")`` names it, since
``training_step`` calls it. On a GPU drop ``accelerator="cpu"``.
"""

from __future__ import annotations

import sys
from typing import cast

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from budgettune.integrations.lightning import PinCallback


class TinyLlama(pl.LightningModule):
    """A causal LM trained on its own inputs."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=128,
        )
        self.model = LlamaForCausalLM(config)
        self.losses: list[float] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(float(loss.item()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def train(pin_path: str, steps: int = 3) -> tuple[pl.Trainer, TinyLlama]:
    """Fit with the pin applied; returns the trainer and the module."""
    pin = PinCallback(pin_path, module="model")  # first: the allocator setting, before CUDA
    torch.manual_seed(0)
    module = TinyLlama()
    rows = cast("Dataset[torch.Tensor]", torch.randint(0, 256, (16, 32)))  # a row a sample
    loader: DataLoader[torch.Tensor] = DataLoader(rows, batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=[pin],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    return trainer, module


if __name__ == "__main__":
    _, fitted = train(sys.argv[1] if len(sys.argv) > 1 else "best.json")
    print("losses:", ", ".join(f"{loss:.4f}" for loss in fitted.losses))
