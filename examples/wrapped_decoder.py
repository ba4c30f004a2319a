"""A workload most fine-tuning jobs look like: a `transformers` decoder held by the user's own
wrapper module, optionally with LoRA adapters (`peft`) on its attention projections.

    budgettune trial -w examples/wrapped_decoder.py:build -o adapter=lora --ac-every 1
    budgettune search -w examples/wrapped_decoder.py:build -o adapter=lora --max-mem 20GB

The decoder is built from a config (random weights, nothing downloaded), like ``hf:``; options:
``family`` (a model type transformers knows: llama, qwen2, mistral, gpt2...), ``adapter``
(``none`` or ``lora``: the base weights frozen, rank-``lora_rank`` adapters trained),
``tiny`` (2 layers, width 64, for CPU tests), ``batch_size``, ``seq_len``, ``dtype``, and config
attributes (``num_hidden_layers=24``...). Block AC finds the decoder's layers inside the wrapper
and, like transformers' own gradient checkpointing, turns the KV cache off on the decoder it
holds (recorded in the trial and the pin as ``use_cache=False``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from budgettune import Workload
from budgettune.workloads import hf


class Finetuner(nn.Module):
    """The user's wrapper: a decoder and a learned scale on its loss."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder
        self.loss_scale = nn.Parameter(torch.ones(()))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.decoder(input_ids=input_ids, labels=labels).loss
        return loss * self.loss_scale


def _with_lora(decoder: nn.Module, rank: int) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in decoder.named_modules()}
    targets = sorted(names & {"q_proj", "v_proj", "c_attn", "query_key_value", "qkv_proj"})
    return get_peft_model(decoder, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))


def build(
    device: torch.device,
    family: str = "llama",
    adapter: str = "none",
    lora_rank: int = 8,
    **options: Any,
) -> Workload:
    """The wrapped decoder, its synthetic batch and loss (see the module docstring)."""
    if adapter not in ("none", "lora"):
        raise ValueError(f"adapter must be none or lora, got {adapter!r}")
    inner = hf.build(device, family, **options)
    decoder = _with_lora(inner.model, lora_rank) if adapter == "lora" else inner.model
    model = Finetuner(decoder).to(device)
    return Workload(
        model=model,
        batch=inner.batch,
        loss=lambda model, batch: model(batch["input_ids"], batch["labels"]),
        optimizer=lambda params: torch.optim.AdamW(
            [p for p in params if p.requires_grad], lr=1e-4
        ),
    )
