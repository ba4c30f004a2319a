"""``builtin:tiny-gpt``: a small fp32 GPT that takes well under a second per step on a CPU.

Pre-LN blocks, causal `F.scaled_dot_product_attention`, GELU MLP, AdamW. The default sizes are
large enough that activation recompute moves the peak visibly, small enough for tests and demos
(benchmarks/results/README.md#tiny-gpt).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgettune.workload import Workload
from budgettune.workloads.losses import next_token_loss


class Block(nn.Module):
    """One pre-LN transformer block."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(dim, dim=-1)
        shape = (batch, seq, self.n_heads, dim // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))


def _init_weights(module: nn.Module) -> None:
    # GPT-2 initialisation: torch's default N(0, 1) embedding makes a tied LM head start at a
    # loss of ~170 instead of ~ln(vocab_size).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class TinyGPT(nn.Module):
    """Token and position embeddings, a `nn.ModuleList` of blocks, final LN, LM head."""

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        seq_len: int,
        tie_embeddings: bool,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def build(
    device: torch.device,
    *,
    vocab_size: int = 4096,
    d_model: int = 256,
    n_layers: int = 4,
    n_heads: int = 4,
    batch_size: int = 4,
    seq_len: int = 192,
    tie_embeddings: bool = True,
    seed: int = 0,
) -> Workload:
    """Build the tiny GPT workload.

    Parameters are initialised from torch's global RNG (the caller seeds it); the batch comes from
    a generator seeded with ``seed``, so it is the same on every call.

    Args:
        device: where the model and batch live.
        vocab_size: vocabulary size (the logits are ``batch_size * seq_len * vocab_size``).
        d_model: model width; must be divisible by ``n_heads``.
        n_layers: number of transformer blocks.
        n_heads: attention heads per block.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        tie_embeddings: share the LM head weight with the token embedding.
        seed: seed of the batch generator.

    Returns:
        The workload: next-token cross entropy, AdamW(lr=3e-4).

    Raises:
        ValueError: when ``d_model`` is not divisible by ``n_heads``.
    """
    if d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
    with torch.device(device):
        model = TinyGPT(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            seq_len=seq_len,
            tie_embeddings=tie_embeddings,
        )
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
    data = data.to(device)
    return Workload(
        model=model,
        batch=(data[:, :-1].contiguous(), data[:, 1:].contiguous()),
        loss=next_token_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
        blocks=list(model.layers),
    )
