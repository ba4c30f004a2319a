"""Losses shared by the built-in language models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross entropy of ``model(tokens)`` against ``labels``, in the logits' dtype."""
    tokens, labels = batch
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
