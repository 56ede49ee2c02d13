"""The vertical drafters as training runs them: every cell of a row at once, with the true codes to its left.

Decoding drafts a row cell by cell (`DraftHeads.draft_step`), each cell reading the codes drawn to its left. Training
knows those codes already, so it drafts every cell of every row in one call, each reading the true codes (and for
"recurrent", the states) to its left. Cell x gives what `draft_step` gives with the same inputs to its left: the
tests hold the two equal, so a head trained here drafts the same way at inference.
"""

from __future__ import annotations

import torch

from ..heads import DraftHeads


def draft_below_teacher_forced(
    heads: DraftHeads,
    hidden_above: torch.Tensor,
    embeds_above: torch.Tensor,
    row_embeds: torch.Tensor,
    row_hidden: torch.Tensor | None = None,
    true_left: torch.Tensor | None = None,
    offset: int = 1,
) -> torch.Tensor:
    """The row `offset` rows below (1 but for per-cell heads) of every row above at once, through the drafter's own
    calls (`context`, `start_embeds`, `step`), as decoding makes them.

    hidden_above [..., C, d_h], embeds_above [..., C, d_e], row_embeds [..., C, d_e] the embeddings of the drafted
    row's true codes (cell x reads x-1..x-left_codes of them, start vectors off the row; only the in-row kinds read
    them), row_hidden [..., C, d_h] the drafted row's true states (only "recurrent" reads them) -> [..., C, d_h], in
    hidden_above's dtype.

    "recurrent": unrolled left to right, cell 0 reading a zero state, cell 1 row_hidden[..., 0, :] (the true state
    predicting cell 0, which block ssd has), every later cell the step's own output at x - 1, or where true_left
    [..., C] is True the true state row_hidden[..., x - 1, :]: on `exact`'s frontier the cell to the left has often
    been through a pass, and the drafter then reads the backbone's state there."""
    vertical = heads.vertical
    context = vertical.context(hidden_above, embeds_above, offset)  # [..., C, d_h], in the drafter's dtype
    if not vertical.left_codes:  # "cell" and "row": every cell from the row above alone
        return vertical.step(context, offset=offset).to(hidden_above.dtype)
    left = vertical.start_embeds(*_codes_to_the_left(row_embeds, vertical.left_codes))  # [..., C, L, d_e]
    if not vertical.reads_left_state:
        return vertical.step(context, left).to(hidden_above.dtype)
    if row_hidden is None:
        raise ValueError("a 'recurrent' drafter is unrolled from the true state predicting cell 0: pass row_hidden.")
    row_states = row_hidden.to(context.dtype)
    state, drafted = torch.zeros_like(context[..., 0, :]), []
    for x in range(context.shape[-2]):
        drafted.append(vertical.step(context[..., x, :], left[..., x, :, :], state))
        state = row_states[..., x, :] if x == 0 else drafted[-1]
        if true_left is not None and 0 < x < context.shape[-2] - 1:
            state = torch.where(true_left[..., x + 1, None], row_states[..., x, :], state)
    return torch.stack(drafted, dim=-2).to(hidden_above.dtype)


def _codes_to_the_left(row_embeds: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What each cell x of a row reads to its left: the embeddings at x-1..x-count [..., C, count, d_e] (zeros where
    off the row), and where they are off the row [C, count], for the drafter's start vectors."""
    cols = row_embeds.shape[-2]
    shifted = [
        torch.cat([torch.zeros_like(row_embeds[..., : min(j, cols), :]), row_embeds[..., : cols - min(j, cols), :]], -2)
        for j in range(1, count + 1)
    ]
    columns = torch.arange(cols, device=row_embeds.device)
    off_row = columns[:, None] < torch.arange(1, count + 1, device=row_embeds.device)
    return torch.stack(shifted, dim=-2), off_row
