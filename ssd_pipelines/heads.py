"""Drafting heads: predict a backbone's hidden state at a nearby cell of the grid.

One small network per spatial offset (docs/decoding.md, "Drafting heads"):

    z = concat(h(y, x), e(y, x))
    f(z) = W0 z + SwiGLU(RMSNorm(W0 z))        # W0: (d_h + d_e) -> d_h
    h_hat(y + dy, x + dx) = f(z)

h is the backbone's last-layer output before its final norm at the position that
predicts cell (y, x); e is the input embedding of the code chosen there. The
draft distribution comes from the backbone's own norm and output head applied to
h_hat, so the heads never predict token ids directly.

Heads are a diffusers `ModelMixin`: `save_pretrained` writes safetensors and a
JSON config (sizes, offsets, codebook size, the base model they were trained
for), which is all that is needed to plug them into an unchanged backbone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn


class DraftHead(nn.Module):
    """f(z) = W0 z + SwiGLU(RMSNorm(W0 z)) for one spatial offset."""

    def __init__(self, hidden_size: int, embed_size: int, intermediate_size: int, eps: float = 1e-6):
        super().__init__()
        self.proj = nn.Linear(hidden_size + embed_size, hidden_size, bias=False)  # W0
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """hidden: [..., d_h], embeds: [..., d_e] -> predicted hidden [..., d_h]."""
        x = self.proj(torch.cat([hidden, embeds.to(hidden.dtype)], dim=-1))
        n = self.norm(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class DraftHeads(ModelMixin, ConfigMixin):
    """The horizontal heads (offsets (0, +dx)) and vertical heads (offsets (+dy, 0)) of one backbone.

    horizontal_offsets must be 1..k_h and vertical_offsets 1..k_v: a row is drafted
    from contiguous offsets, so a gap would leave a cell without a head.
    """

    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        hidden_size: int,
        embed_size: int,
        codebook_size: int,
        horizontal_offsets: tuple[int, ...] = (1, 2, 3, 4, 5),
        vertical_offsets: tuple[int, ...] = (1, 2),
        intermediate_size: int | None = None,
        base_model: str | None = None,
    ):
        super().__init__()
        for name, offsets in (("horizontal_offsets", horizontal_offsets), ("vertical_offsets", vertical_offsets)):
            if list(offsets) != list(range(1, len(offsets) + 1)):
                raise ValueError(f"{name} must be 1, 2, ..., k (contiguous from 1), got {list(offsets)}.")
        if not vertical_offsets:
            raise ValueError("at least one vertical offset is needed: SSD drafts every row after the first with them.")
        intermediate_size = intermediate_size or 2 * hidden_size
        self.horizontal = nn.ModuleList(
            DraftHead(hidden_size, embed_size, intermediate_size) for _ in horizontal_offsets
        )
        self.vertical = nn.ModuleList(DraftHead(hidden_size, embed_size, intermediate_size) for _ in vertical_offsets)

    @property
    def max_horizontal(self) -> int:
        return len(self.horizontal)

    @property
    def max_vertical(self) -> int:
        return len(self.vertical)

    def draft_right(self, hidden: torch.Tensor, embeds: torch.Tensor, count: int) -> torch.Tensor:
        """Hidden states of the `count` cells right of one cell. [B, d_h], [B, d_e] -> [B, count, d_h]."""
        return self._run(self.horizontal[:count], hidden, embeds)

    def draft_below(self, hidden: torch.Tensor, embeds: torch.Tensor, rows: int) -> torch.Tensor:
        """Hidden states of the `rows` rows below a committed row. [B, C, d_h], [B, C, d_e] -> [B, rows, C, d_h]."""
        return self._run(self.vertical[:rows], hidden, embeds)

    def _run(self, heads: nn.ModuleList, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Heads in their own dtype, drafts in the backbone's: heads kept in fp32 beside a bf16 backbone work."""
        dtype = self.dtype
        drafts = torch.stack([head(hidden.to(dtype), embeds.to(dtype)) for head in heads], dim=1)
        return drafts.to(hidden.dtype)

    def check_compatible(self, backbone) -> None:
        """Raise, naming both shapes (or devices), if these heads cannot read this backbone's states."""
        ours = (self.config.hidden_size, self.config.embed_size, self.config.codebook_size)
        theirs = (backbone.hidden_size, backbone.embed_size, backbone.grid.codebook_size)
        if ours != theirs:
            raise ValueError(
                "These drafting heads do not fit this backbone: heads expect (hidden size, embedding size, "
                f"codebook size) = {ours}, the backbone has {theirs}. Load the heads trained for this backbone"
                + (f" (these were trained for {self.config.base_model!r})." if self.config.base_model else ".")
            )
        if self.device != backbone.device:
            raise ValueError(
                f"the drafting heads are on {self.device} and the backbone on {backbone.device}: move both, "
                "e.g. pipe.to(device)."
            )
