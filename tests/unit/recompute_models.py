"""Small models for the recompute/measure tests (independent of the built-in workloads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgettune.workload import Workload


class Block(nn.Module):
    """A pre-LN transformer block: attention and a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


def lm_loss(model, batch):
    tokens, labels = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())


def tiny_lm_workload(
    device: torch.device | str = "cpu",
    *,
    vocab: int = 256,
    dim: int = 64,
    heads: int = 4,
    layers: int = 4,
    seq: int = 32,
    batch: int = 8,
    optimizer=None,
    blocks: bool = True,
) -> Workload:
    torch.manual_seed(0)
    device = torch.device(device)
    model = TinyLM(vocab, dim, heads, layers, seq).to(device)
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)
    return Workload(
        model=model,
        batch=(tokens, labels),
        loss=lm_loss,
        optimizer=optimizer,
        blocks=model.layers if blocks else None,
    )
