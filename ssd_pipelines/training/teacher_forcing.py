"""The vertical drafters as training runs them: every cell of a row at once, with the true codes to its left.

Decoding drafts a row cell by cell (`DraftHeads.draft_step`), each cell reading the codes drawn to its left. Training
knows those codes already, so it drafts every cell of every row in one call, each reading the true codes (and for
"recurrent", the states) to its left. Cell x gives what `draft_step` gives with the same inputs to its left: the
tests hold the two equal, so a head trained here drafts the same way at inference.
"""

from __future__ import annotations

import torch

from ..heads import CellDrafter, DraftHeads, RowDraftHead


def draft_below_teacher_forced(
    heads: DraftHeads,
    hidden_above: torch.Tensor,
    embeds_above: torch.Tensor,
    row_embeds: torch.Tensor,
    row_hidden: torch.Tensor | None = None,
    true_left: torch.Tensor | None = None,
    offset: int = 1,
) -> torch.Tensor:
    """The row `offset` rows below (1 but for per-cell heads) of every row above at once.

    hidden_above [..., C, d_h], embeds_above [..., C, d_e], row_embeds [..., C, d_e] the embeddings of the drafted
    row's true codes (cell x reads x-1..x-left_codes of them, start vectors off the row; only the in-row kinds read
    them), row_hidden [..., C, d_h] the drafted row's true states (only "recurrent" reads them: column 0's, the
    state its cell 1 starts from; its later cells read the drafter's own outputs, unrolled, or the true state to
    their left where true_left [..., C] is True) -> [..., C, d_h], in hidden_above's dtype. Works for every kind
    ("cell": the head of that offset)."""
    vertical, dtype = heads.vertical, heads.dtype
    hidden, embeds = hidden_above.to(dtype), embeds_above.to(dtype)
    if isinstance(vertical, CellDrafter):  # one head per offset, each cell from the cell above alone
        out = vertical[offset - 1](hidden, embeds)
    else:
        states = row_hidden if vertical.reads_left_state else None
        out = _row_teacher_forced(vertical[0], hidden, embeds, row_embeds.to(dtype), states, true_left)
    return out.to(hidden_above.dtype)


def _row_teacher_forced(
    head: RowDraftHead,
    hidden: torch.Tensor,
    embeds: torch.Tensor,
    row_embeds: torch.Tensor,
    row_states: torch.Tensor | None,
    true_left: torch.Tensor | None,
) -> torch.Tensor:
    """Every cell of the row below, cell x reading row_embeds at x-1..x-L: [..., C, d] -> [..., C, d_h].

    "recurrent": unrolled left to right, cell 0 reading a zero state, cell 1 row_states[..., 0, :] (the true state
    predicting cell 0, which block ssd has), every later cell the step's own output at x - 1, or where true_left
    [..., C] is True the true state row_states[..., x - 1, :]: on `exact`'s frontier the cell to the left has often
    been through a pass, and the drafter then reads the backbone's state there."""
    context = head.context(hidden, embeds)
    if not head.left_codes:
        return head.refine(context)
    cols = row_embeds.shape[-2]
    row_embeds = row_embeds.to(context.dtype)
    shifted = []
    for j in range(1, head.left_codes + 1):  # cell x reads the code at x - j, or start vector j where x < j
        off = min(j, cols)
        start = head.start[j - 1].to(context.dtype).expand(*row_embeds.shape[:-2], off, row_embeds.shape[-1])
        shifted.append(torch.cat([start, row_embeds[..., : cols - off, :]], dim=-2))
    left = torch.stack(shifted, dim=-2)  # [..., C, L, d_e]
    if not head.reads_state:
        return head.step(context, left)
    if row_states is None:
        raise ValueError("a 'recurrent' drafter is unrolled from the true state predicting cell 0: pass it.")
    row_states = row_states.to(context.dtype)
    state, drafted = torch.zeros_like(context[..., 0, :]), []
    for x in range(cols):
        drafted.append(head.step(context[..., x, :], left[..., x, :, :], state))
        state = row_states[..., x, :] if x == 0 else drafted[-1]
        if true_left is not None and 0 < x < cols - 1:
            state = torch.where(true_left[..., x + 1, None], row_states[..., x, :], state)
    return torch.stack(drafted, dim=-2)
