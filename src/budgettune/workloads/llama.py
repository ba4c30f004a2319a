"""``builtin:llama``: the Llama-3.2-1B shape, the GPU reference workload.

dim 2048, 16 layers, 32 query heads and 8 KV heads (GQA), SwiGLU FFN 8192, vocab 128256,
RMSNorm, RoPE (theta 500000, without Llama 3's long-context frequency scaling), no biases, held
in bf16; the optimizer is ``AdamW(params, lr=1e-5)`` as usually written (no implementation
flags).

The defaults reproduce the workload of the pre-project H200 reference: an untied LM head and
the cross entropy on the bf16 logits, which shows the reference's optimizer-step floor; the
real model's tied head (``tie_embeddings=True``) with a float32 loss (``fp32_loss=True``)
moves the peak into the backward instead (benchmarks/results/README.md#llama-definition).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgettune.workload import Workload
from budgettune.workloads.losses import next_token_loss


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the head dimension (the Hugging Face Llama layout)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention through `F.scaled_dot_product_attention(enable_gqa=True)`."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        # enable_gqa exists from torch 2.5; budgettune requires torch>=2.6.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward, each with a residual."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Embedding, a `nn.ModuleList` of blocks, final RMSNorm, LM head tied to the embedding."""

    def __init__(
        self,
        *,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        ffn_dim: int,
        vocab_size: int,
        rope_theta: float,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.rope_theta = rope_theta
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_heads, n_kv_heads, ffn_dim) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=0.02)

    def _rope_tables(self, seq: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed in float32 on every call rather than held in a buffer: `model.to(bf16)` would
        # round a buffer, and bf16 angles are wrong at large positions.
        inv_freq = 1.0 / self.rope_theta ** (
            torch.arange(0, self.head_dim, 2, device=x.device, dtype=torch.float32) / self.head_dim
        )
        angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        cos, sin = self._rope_tables(tokens.shape[1], x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def _loss_fp32(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    logits = model(tokens)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def build(
    device: torch.device,
    *,
    dim: int = 2048,
    n_layers: int = 16,
    n_heads: int = 32,
    n_kv_heads: int = 8,
    ffn_dim: int = 8192,
    vocab_size: int = 128256,
    batch_size: int = 4,
    seq_len: int = 1024,
    rope_theta: float = 500000.0,
    seed: int = 0,
    tie_embeddings: bool = False,
    fp32_loss: bool = False,
) -> Workload:
    """Build the Llama-3.2-1B-shaped workload, parameters in bf16.

    Parameters are initialised from torch's global RNG (the caller seeds it) directly on
    ``device``; the batch comes from a CPU generator seeded with ``seed``, so it is the same on
    every call and every device. On the meta device it costs nothing (used to count parameters).

    Args:
        device: where the model and batch live.
        dim: model width; divisible by ``n_heads``.
        n_layers: number of transformer blocks.
        n_heads: query heads; divisible by ``n_kv_heads``.
        n_kv_heads: key/value heads (grouped-query attention).
        ffn_dim: SwiGLU hidden width.
        vocab_size: vocabulary size.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        rope_theta: RoPE base frequency.
        seed: seed of the batch generator.
        tie_embeddings: share the LM head with the embedding, as Llama-3.2-1B does (untied,
            the default, adds 262M parameters: +2.1 GB of parameters, grads and AdamW state).
        fp32_loss: upcast the logits to float32 for the cross entropy (B·T·vocab floats: 2.1 GB
            at the defaults); False computes it on the bf16 logits.

    Returns:
        The workload: next-token cross entropy in float32, ``AdamW(params, lr=1e-5)``.

    Raises:
        ValueError: when the head counts do not divide.
    """
    if dim % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"dim {dim} must be divisible by n_heads {n_heads}, "
            f"and n_heads by n_kv_heads {n_kv_heads}"
        )
    with torch.device(device):
        model = Llama(
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            ffn_dim=ffn_dim,
            vocab_size=vocab_size,
            rope_theta=rope_theta,
            tie_embeddings=tie_embeddings,
        )
    model.to(torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
    data = data.to(device)
    return Workload(
        model=model,
        batch=(data[:, :-1].contiguous(), data[:, 1:].contiguous()),
        loss=_loss_fp32 if fp32_loss else next_token_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-5),
        blocks=list(model.layers),
    )
