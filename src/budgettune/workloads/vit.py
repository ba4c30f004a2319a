"""``builtin:vit``: the ViT-B/16 shape in pure torch (no torchvision).

224-pixel images in 16-pixel patches (196 tokens + a class token), dim 768, 12 pre-LN blocks of
12 heads, MLP 3072, 1000 classes: ~86.6M parameters, held in bf16, B=64. The loss is cross
entropy in float32 on the logits; the optimizer is ``AdamW(params, lr=1e-4)`` as usually written.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgettune.workload import Workload


class Block(nn.Module):
    """One pre-LN encoder block: bidirectional attention and a GELU MLP."""

    def __init__(self, dim: int, n_heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seq, 3, self.n_heads, dim // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionTransformer(nn.Module):
    """Patch embedding (a strided conv), class token, learned positions, blocks, head."""

    def __init__(
        self,
        *,
        image_size: int,
        patch_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        mlp_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, n_heads, mlp_dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def build(
    device: torch.device,
    *,
    image_size: int = 224,
    patch_size: int = 16,
    dim: int = 768,
    n_layers: int = 12,
    n_heads: int = 12,
    mlp_dim: int = 3072,
    num_classes: int = 1000,
    batch_size: int = 64,
    seed: int = 0,
) -> Workload:
    """Build the ViT-B/16-shaped workload, parameters and images in bf16.

    Parameters are initialised from torch's global RNG (the caller seeds it) directly on
    ``device``; the batch comes from a CPU generator seeded with ``seed``.

    Args:
        device: where the model and batch live.
        image_size: image height and width in pixels; divisible by ``patch_size``.
        patch_size: patch height and width in pixels.
        dim: model width; divisible by ``n_heads``.
        n_layers: number of encoder blocks.
        n_heads: attention heads per block.
        mlp_dim: MLP hidden width.
        num_classes: classifier outputs.
        batch_size: images per step.
        seed: seed of the batch generator.

    Returns:
        The workload: classification cross entropy in float32, ``AdamW(params, lr=1e-4)``.

    Raises:
        ValueError: when the sizes do not divide.
    """
    if image_size % patch_size or dim % n_heads:
        raise ValueError(
            f"image_size {image_size} must be divisible by patch_size {patch_size}, "
            f"and dim {dim} by n_heads {n_heads}"
        )
    with torch.device(device):
        model = VisionTransformer(
            image_size=image_size,
            patch_size=patch_size,
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            mlp_dim=mlp_dim,
            num_classes=num_classes,
        )
    model.to(torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
    return Workload(
        model=model,
        batch=(images.to(device, torch.bfloat16), labels.to(device)),
        loss=_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
        blocks=list(model.blocks),
    )
