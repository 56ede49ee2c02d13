"""The self-distillation objective: each head's Smooth L1 from [h; e] at a cell to h at its offset."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..backbones.base import ImageBackbone
from ..heads import DraftHeads
from .distill_data import DistillationData


def head_offsets(heads: DraftHeads) -> list[tuple[str, tuple[int, int], nn.Module]]:
    """(name, (dy, dx), head) for every head: horizontal ones first, as in the loss vector."""
    right = [(f"horizontal_{dx}", (0, dx), head) for dx, head in enumerate(heads.horizontal, start=1)]
    below = [(f"vertical_{dy}", (dy, 0), head) for dy, head in enumerate(heads.vertical, start=1)]
    return right + below


def check_offsets(heads: DraftHeads, rows: int, cols: int) -> None:
    """Raise if a head's offset leaves the grid: it would have no cell to learn from."""
    for name, (dy, dx), _ in head_offsets(heads):
        if dy >= rows or dx >= cols:
            raise ValueError(f"head {name} has no target cell in a {rows}x{cols} grid: train fewer heads.")


class HeadLosses(nn.Module):
    """Smooth L1 of every head on a batch, as one module so DDP can wrap it (DraftHeads has no forward)."""

    def __init__(self, heads: DraftHeads):
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """hidden [b, S, R, C, d], embeds [b, R, C, d_e] -> loss of each head [n_heads], over every cell with a target."""
        rows, cols = hidden.shape[2:4]
        check_offsets(self.heads, rows, cols)
        embeds = embeds.unsqueeze(1).expand(-1, hidden.shape[1], -1, -1, -1)
        losses = []
        for _, (dy, dx), head in head_offsets(self.heads):
            source = (slice(None), slice(None), slice(0, rows - dy), slice(0, cols - dx))
            target = (slice(None), slice(None), slice(dy, None), slice(dx, None))
            losses.append(F.smooth_l1_loss(head(hidden[source], embeds[source]), hidden[target]))
        return torch.stack(losses)


def distill_loss(
    heads: DraftHeads, backbone: ImageBackbone, batch: DistillationData
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the heads' losses, each head's loss [n_heads] detached); order as in `head_offsets`.

    Summed, not averaged: every head then gets exactly the gradient of its own loss.
    """
    return batch_loss(HeadLosses(heads), backbone, batch)


def batch_loss(
    objective: nn.Module, backbone: ImageBackbone, batch: DistillationData
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss through `objective`: HeadLosses itself, or the DDP wrapper train_heads prepared around it."""
    weight = next(objective.parameters())
    with torch.no_grad():  # the backbone is only read: no gradient can reach it
        embeds = backbone.embed_codes(batch.codes.to(backbone.device, torch.long))
    hidden = batch.hidden.to(weight.device, weight.dtype)
    per_head = objective(hidden, embeds.to(weight.device, weight.dtype))
    return per_head.sum(), per_head.detach()
