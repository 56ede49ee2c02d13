"""Drafting heads: predict a backbone's hidden state at a nearby cell of the grid.

One small network per spatial offset (docs/decoding.md, "Drafting heads"):

    z = concat(h(y, x), e(y, x))
    f(z) = W0 z + SwiGLU(RMSNorm(W0 z))        # W0: (d_h + d_e) -> d_h
    h_hat(y + dy, x + dx) = f(z)

h is the backbone's last-layer output before its final norm at the position that
predicts cell (y, x); e is the input embedding of the code chosen there. The
draft distribution comes from the backbone's own norm and output head applied to
h_hat, so the heads never predict token ids directly.

The vertical drafter of offset (+1, 0) comes in four kinds (`vertical_drafter`), each a class behind one
interface, `VerticalDrafter` (`CellDrafter`, `RowDrafter`, `InRowDrafter`, `RecurrentDrafter`): the engines,
the trainer and the benchmarks read what a drafter reads from its attributes, never from its name:

    "cell"   the per-cell head above (the paper's, the default)
    "row"    x = Conv1d over [h; e] of (y, x-k..x+k) of the committed row above (zero padding at the row
             ends), then h_hat(y + 1, x) = x + SwiGLU(RMSNorm(x))
    "inrow"  x = the same convolution + W_left [e(y+1, x-1); ...; e(y+1, x-L)] (a learned start vector for
             each x - j that falls off the row's left end), then x + SwiGLU(RMSNorm(x)): the row is drafted
             left to right, each cell reading the codes drafted to its left (`row_context`, `draft_step`)
    "recurrent"  "inrow" + W_state s(y+1, x-1), s the state predicting the cell to its left: at inference the
             drafter's own h_hat there (the backbone's true state where it has one, as for the row's first cell
             in block ssd), so each draft carries what the row drafted so far (EAGLE's feature recurrence);
             trained unrolled along the row, each step on its own previous output (EAGLE-3's training-time test)

Horizontal heads are per-cell in every kind.

Heads are a diffusers `ModelMixin`: `save_pretrained` writes safetensors and a
JSON config (sizes, offsets, codebook size, the base model they were trained
for), which is all that is needed to plug them into an unchanged backbone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

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
        return self.refine(self.project(hidden, embeds))

    def project(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """W0 z: [..., d_h], [..., d_e] -> [..., d_h]."""
        return self.proj(torch.cat([hidden, embeds.to(hidden.dtype)], dim=-1))

    def refine(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class RowDraftHead(nn.Module):
    """The row drafters of offset (+1, 0): x = conv(row above)[x] (+ W_left [e(x-1); ...; e(x-L)] if in-row)
    (+ W_state s(x-1) if it reads the left state), then x + SwiGLU(RMSNorm(x)). left_codes = 0 is the "row"
    kind, > 0 the "inrow" kind, and with left_state the "recurrent" kind."""

    def __init__(
        self,
        hidden_size: int,
        embed_size: int,
        intermediate_size: int,
        kernel: int,
        left_codes: int,
        left_state: bool = False,
        eps=1e-6,
    ):
        super().__init__()
        self.kernel, self.left_codes, self.reads_state = kernel, left_codes, left_state
        self.conv = nn.Conv1d(hidden_size + embed_size, hidden_size, kernel, padding=kernel // 2, bias=False)
        if left_codes:
            self.left = nn.Linear(left_codes * embed_size, hidden_size, bias=False)  # W_left
            self.start = nn.Parameter(torch.zeros(left_codes, embed_size))  # e where x - j is off the row, j = 1..L
        if left_state:
            self.state = nn.Linear(hidden_size, hidden_size, bias=False)  # W_state; s = 0 left of the row
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)

    def context(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The convolution over a whole row: [..., C, d_h], [..., C, d_e] -> [..., C, d_h]."""
        z = torch.cat([hidden, embeds.to(hidden.dtype)], dim=-1)
        lead, cols = z.shape[:-2], z.shape[-2]
        out = self.conv(z.reshape(-1, cols, z.shape[-1]).transpose(1, 2)).transpose(1, 2)
        return out.reshape(*lead, cols, out.shape[-1])

    def context_at(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The convolution at one column from its neighbourhood: [..., kernel, d_h], [..., kernel, d_e] (columns
        x - k..x + k, zeros where off the row) -> [..., d_h]."""
        z = torch.cat([hidden, embeds.to(hidden.dtype)], dim=-1)  # [..., kernel, d]
        return torch.einsum("...kd,hdk->...h", z, self.conv.weight)

    def refine(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))

    def with_start(self, left: torch.Tensor, off_row: torch.Tensor) -> torch.Tensor:
        """left [..., L, d_e] with the start vectors wherever off_row [..., L] is True."""
        return torch.where(off_row[..., None], self.start.to(left.dtype), left)

    def step(self, context: torch.Tensor, left: torch.Tensor | None, state: torch.Tensor | None = None) -> torch.Tensor:
        """context [..., d_h], left [..., L, d_e] (e(x-1) first; None for "row"), state [..., d_h] (the state
        predicting the cell to the left, zeros at x = 0; "recurrent" only) -> h_hat [..., d_h]."""
        if self.reads_state:
            if state is None:
                raise ValueError(
                    "a 'recurrent' drafter reads the state predicting the cell to its left (its own draft there, or "
                    "the backbone's; zeros at the row's first cell): pass left_state [..., d_h]."
                )
            context = context + self.state(state.to(context.dtype))
        elif state is not None:
            raise ValueError("only a 'recurrent' drafter reads the state to a cell's left: pass left_state=None.")
        if self.left_codes:
            if left is None or left.shape[-2] != self.left_codes:
                raise ValueError(
                    f"an in-row drafter reads the {self.left_codes} codes to a cell's left: pass their embeddings "
                    f"[..., {self.left_codes}, d_e] (start vectors where off the row), got "
                    f"{None if left is None else tuple(left.shape)}."
                )
            context = context + self.left(left.to(context.dtype).flatten(-2))
        elif left is not None:
            raise ValueError("a 'row' drafter reads no codes to a cell's left: pass left_embeds=None.")
        return self.refine(context)


class VerticalDrafter(nn.ModuleList, ABC):
    """The proposer interface every kind of vertical drafter offers the engines, the trainer and the benchmarks.

    A drafter proposes the hidden state of cell (y + dy, x) from the row above it, y, read at columns
    x - reach..x + reach (`context`, or `context_at` one cell at a time), then `step`s: for the in-row kinds with
    the embeddings of the `left_codes` codes drawn to the cell's left, and for the recurrent kind the state
    predicting the cell to its left. A drafter with left_codes = 0 drafts a whole row in one call; one with
    left_codes > 0 drafts it left to right. What a caller needs to know of a kind is in these attributes, never in
    its name. The modules, one per vertical offset, are its items: heads saved before the classes load unchanged.
    """

    kind: ClassVar[str]
    reads_left_state: ClassVar[bool] = False
    left_codes: int = 0  # codes to a cell's left it reads (0: every cell of a row at once)
    reach: int = 0  # columns either side of x it reads in the row above

    @property
    def max_rows(self) -> int:
        """How many rows below the committed one it drafts (vertical offsets 1..max_rows)."""
        return len(self)

    @property
    def dtype(self) -> torch.dtype:
        """Its weights' dtype, read without walking every parameter (ModelMixin.dtype does): a row's steps ask."""
        return self[0].norm.weight.dtype

    @abstractmethod
    def context(self, hidden_above: torch.Tensor, embeds_above: torch.Tensor, offset: int = 1) -> torch.Tensor:
        """What a committed row gives each cell `offset` rows below it: [..., C, d_h], [..., C, d_e] -> [..., C, d_h],
        in the drafter's dtype."""

    @abstractmethod
    def context_at(self, near_hidden: torch.Tensor, near_embeds: torch.Tensor) -> torch.Tensor:
        """`context` at single cells of the row below, from the row above's columns x - reach..x + reach around
        each (zeros where off the row): [n, 2 reach + 1, d_h], [n, 2 reach + 1, d_e] -> [n, d_h]."""

    def step(
        self,
        context: torch.Tensor,
        left_embeds: torch.Tensor | None = None,
        left_state: torch.Tensor | None = None,
        offset: int = 1,
    ) -> torch.Tensor:
        """Draft cells from their `context` [..., d_h], the embeddings of the codes to their left [..., L, d_e]
        (e(x - 1) first, start vectors where off the row: `start_embeds`) and the state predicting the cell to
        their left [..., d_h] (zeros at x = 0), each where this kind reads it -> h_hat [..., d_h]."""
        if left_embeds is not None or left_state is not None:
            raise ValueError(
                f"a {self.kind!r} drafter reads neither the codes nor the state to a cell's left: pass "
                "left_embeds=None and left_state=None."
            )
        return self[offset - 1].refine(context)

    def start_embeds(self, left_embeds: torch.Tensor, off_row: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"start_embeds is for 'inrow' and 'recurrent' vertical drafters, not {self.kind!r}.")


class CellDrafter(VerticalDrafter):
    """The paper's: one `DraftHead` per vertical offset, each cell from the cell above alone."""

    kind = "cell"

    def __init__(self, hidden_size, embed_size, intermediate_size, vertical_offsets, **_):
        super().__init__(DraftHead(hidden_size, embed_size, intermediate_size) for _ in vertical_offsets)

    def context(self, hidden_above, embeds_above, offset=1):
        return self[offset - 1].project(hidden_above.to(self.dtype), embeds_above.to(self.dtype))

    def context_at(self, near_hidden, near_embeds):
        return self.context(near_hidden[..., 0, :], near_embeds[..., 0, :])


class RowDrafter(VerticalDrafter):
    """Row context: x = Conv1d over [h; e] of the row above's columns x - reach..x + reach, then refined."""

    kind = "row"
    reads_left_codes: ClassVar[bool] = False

    def __init__(self, hidden_size, embed_size, intermediate_size, row_kernel, left_codes, **_):
        left = left_codes if self.reads_left_codes else 0
        super().__init__(
            [RowDraftHead(hidden_size, embed_size, intermediate_size, row_kernel, left, self.reads_left_state)]
        )
        self.left_codes, self.reach = left, row_kernel // 2

    def context(self, hidden_above, embeds_above, offset=1):
        return self[0].context(hidden_above.to(self.dtype), embeds_above.to(self.dtype))

    def context_at(self, near_hidden, near_embeds):
        return self[0].context_at(near_hidden.to(self.dtype), near_embeds.to(self.dtype))

    def step(self, context, left_embeds=None, left_state=None, offset=1):
        dtype = self.dtype
        return self[0].step(
            context.to(dtype),
            None if left_embeds is None else left_embeds.to(dtype),
            None if left_state is None else left_state.to(dtype),
        )


class InRowDrafter(RowDrafter):
    """Row context + W_left [e(x-1); ...; e(x-L)]: each cell also reads the codes drawn to its left."""

    kind = "inrow"
    reads_left_codes = True

    def start_embeds(self, left_embeds, off_row):
        return self[0].with_start(left_embeds.to(self.dtype), off_row)


class RecurrentDrafter(InRowDrafter):
    """In-row + W_state s(x - 1): each cell also reads the state predicting the cell to its left (EAGLE's
    feature recurrence)."""

    kind = "recurrent"
    reads_left_state = True


VERTICAL_DRAFTERS: dict[str, type[VerticalDrafter]] = {
    cls.kind: cls for cls in (CellDrafter, RowDrafter, InRowDrafter, RecurrentDrafter)
}
"""The kinds of vertical drafter: per cell (the paper's), row context, row context + in-row dependence, and that
+ the drafter's own state at the cell to the left."""


class DraftHeads(ModelMixin, ConfigMixin):
    """The horizontal heads (offsets (0, +dx)) and vertical heads (offsets (+dy, 0)) of one backbone.

    horizontal_offsets must be 1..k_h and vertical_offsets 1..k_v: a row is drafted
    from contiguous offsets, so a gap would leave a cell without a head.

    vertical_drafter: "cell" (one per-cell head per vertical offset, the paper's), "row" (the row above through
    a Conv1d of width row_kernel), "inrow" (that, plus the left_codes codes drafted to each cell's left: the
    row is drafted left to right) or "recurrent" (that, plus the state predicting the cell to the left). The row
    kinds have one vertical offset, (1,); "row" ignores left_codes.
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
        vertical_drafter: str = "cell",
        row_kernel: int = 5,
        left_codes: int = 2,
    ):
        super().__init__()
        for name, offsets in (("horizontal_offsets", horizontal_offsets), ("vertical_offsets", vertical_offsets)):
            if list(offsets) != list(range(1, len(offsets) + 1)):
                raise ValueError(f"{name} must be 1, 2, ..., k (contiguous from 1), got {list(offsets)}.")
        if not vertical_offsets:
            raise ValueError("at least one vertical offset is needed: SSD drafts every row after the first with them.")
        check_vertical_drafter(vertical_drafter, row_kernel, left_codes, vertical_offsets)
        intermediate_size = intermediate_size or 2 * hidden_size
        self.horizontal = nn.ModuleList(
            DraftHead(hidden_size, embed_size, intermediate_size) for _ in horizontal_offsets
        )
        self.vertical: VerticalDrafter = VERTICAL_DRAFTERS[vertical_drafter](
            hidden_size=hidden_size,
            embed_size=embed_size,
            intermediate_size=intermediate_size,
            vertical_offsets=vertical_offsets,
            row_kernel=row_kernel,
            left_codes=left_codes,
        )

    @property
    def max_horizontal(self) -> int:
        return len(self.horizontal)

    @property
    def max_vertical(self) -> int:
        return self.vertical.max_rows

    @property
    def drafter(self) -> str:
        """The kind of vertical drafter: "cell", "row", "inrow" or "recurrent" (heads saved before the kinds
        existed: "cell"). Callers read what it does from `vertical` (`VerticalDrafter`), not from this name."""
        return self.vertical.kind

    @property
    def in_row(self) -> bool:
        """Whether the vertical drafter reads the codes to a cell's left (a row is then drafted left to right)."""
        return self.vertical.left_codes > 0

    @property
    def reads_left_state(self) -> bool:
        """Whether it also reads the state predicting the cell to the left ("recurrent")."""
        return self.vertical.reads_left_state

    def draft_right(self, hidden: torch.Tensor, embeds: torch.Tensor, count: int) -> torch.Tensor:
        """Hidden states of the `count` cells right of one cell. [B, d_h], [B, d_e] -> [B, count, d_h]."""
        dtype = self.dtype
        drafts = [head(hidden.to(dtype), embeds.to(dtype)) for head in self.horizontal[:count]]
        return torch.stack(drafts, dim=1).to(hidden.dtype)

    def draft_below(self, hidden: torch.Tensor, embeds: torch.Tensor, rows: int) -> torch.Tensor:
        """Hidden states of the `rows` rows below a committed row. [B, C, d_h], [B, C, d_e] -> [B, rows, C, d_h].

        One parallel call for drafters that read no codes to a cell's left; an in-row drafter ("inrow",
        "recurrent") drafts left to right (`row_context`, `draft_step`)."""
        drafter = self.vertical
        if drafter.left_codes:
            raise ValueError(
                f"an {drafter.kind!r} drafter drafts a row left to right, each cell from the codes drafted to its "
                "left: call row_context once per row, then draft_step cell by cell."
            )
        if not 1 <= rows <= drafter.max_rows:
            raise ValueError(
                f"a {drafter.kind!r} drafter drafts rows 1..{drafter.max_rows} below the committed one: pass rows in "
                f"that range, not {rows}."
            )
        drafts = [drafter.step(drafter.context(hidden, embeds, dy), offset=dy) for dy in range(1, rows + 1)]
        return torch.stack(drafts, dim=-3).to(hidden.dtype)

    def row_context(self, hidden_above: torch.Tensor, embeds_above: torch.Tensor) -> torch.Tensor:
        """What the committed row above gives each cell of the row below, once per row (the row kinds: the
        convolution; "cell": W0 z). [B', C, d_h], [B', C, d_e] -> [B', C, d_h], in the heads' dtype (pass it to
        `draft_step` as it is)."""
        return self.vertical.context(hidden_above, embeds_above)

    def row_context_at(self, hidden_near: torch.Tensor, embeds_near: torch.Tensor) -> torch.Tensor:
        """`row_context` at single cells, from the row above's columns x - k..x + k around each (k = the drafter's
        reach: row_kernel // 2, 0 for "cell"; zeros where off the row): [n, 2k + 1, d_h], [n, 2k + 1, d_e] -> [n, d_h],
        heads' dtype."""
        return self.vertical.context_at(hidden_near, embeds_near)

    def start_embeds(self, left_embeds: torch.Tensor, off_row: torch.Tensor) -> torch.Tensor:
        """In-row kinds: left_embeds [..., left_codes, d_e] (e(x-1) first) with the learned start vector j wherever
        x - j falls off the row's left end (off_row [..., left_codes] True)."""
        return self.vertical.start_embeds(left_embeds, off_row)

    def draft_step(
        self,
        context_x: torch.Tensor,
        left_embeds: torch.Tensor | None = None,
        left_state: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One cell of the row below: context_x [B', d_h] (its column of `row_context`), for the in-row kinds the
        embeddings of the codes to its left, left_embeds [B', left_codes, d_e] (e(x-1) first, start vectors where
        off the row; see `start_embeds`), and for "recurrent" left_state [B', d_h], the state predicting the cell
        to its left (the drafter's own output there, or the backbone's state where it has one; zeros at x = 0)
        -> h_hat [B', d_h], in the heads' dtype. "cell" and "row": left_embeds=None."""
        return self.vertical.step(context_x, left_embeds, left_state)

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


def check_vertical_drafter(drafter, row_kernel, left_codes, vertical_offsets) -> None:
    """Raise a ValueError that says what to pass, unless these are a valid vertical drafter's settings."""
    if drafter not in VERTICAL_DRAFTERS:
        raise ValueError(
            f"vertical_drafter must be one of {', '.join(map(repr, VERTICAL_DRAFTERS))} (per cell, the paper's; "
            f"row context; row context + the codes to the left; that + the state to the left), got {drafter!r}."
        )
    if isinstance(row_kernel, bool) or not isinstance(row_kernel, int) or row_kernel < 1 or row_kernel % 2 == 0:
        raise ValueError(
            f"row_kernel must be an odd positive integer (the width of the row-above neighbourhood, centred on the "
            f"cell: 1, 3, 5, ...), got {row_kernel!r}."
        )
    if isinstance(left_codes, bool) or not isinstance(left_codes, int) or left_codes < 1:
        raise ValueError(
            f"left_codes must be a positive integer (how many codes to its left an in-row drafter reads), "
            f"got {left_codes!r}."
        )
    if drafter != "cell" and list(vertical_offsets) != [1]:
        raise ValueError(
            f"a {drafter!r} vertical drafter drafts the row just below the committed one: pass vertical_offsets=(1,), "
            f"not {tuple(vertical_offsets)} (several vertical offsets need vertical_drafter='cell')."
        )
