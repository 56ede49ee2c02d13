"""Spatially Speculative Decoding with auto-correcting verification (docs/decoding.md).

The grid is decoded in blocks. The first row goes in blocks of 1 + k_h cells:
the first cell is sampled from the backbone's exact distribution, the horizontal
heads draft the k_h cells right of it. Every later block is k_v whole rows,
drafted at once by the vertical heads from the committed row above; its first
cell, whose exact distribution is already known, is sampled from it (ours).
With an in-row vertical drafter (heads.py) the row is one block drafted left to
right instead: each cell from the row above and the codes drawn to its left, the
first cell's included ("recurrent": and the state predicting the cell to its left,
the backbone's for the first cell, the drafts' own after it), its q the
distribution its code was drawn from.

A block is then verified in rounds. Each round is one backbone pass over the
drafted block appended to the committed KV cache, giving the target p at every
cell; every cell is accepted independently with probability min(1, p/q), a
rejected one resampled from norm(max(0, p - q)); the cache is cropped back to
the block start. From the second round on every cell's q is the previous
round's p. A last pass over the final codes commits the block: it writes the
cache and yields the hidden states that draft the next block.

An image whose round rejected nothing has converged: any later round would
accept all its cells with probability 1, so it is frozen, and once every image
of the batch has converged the rounds stop and that round's pass, which saw the
final codes, is the commit. At most r rounds is the paper's decoding (lossy for
small r); with no cap (verify_rounds=None) it returns exactly the AR
distribution, but `exact` (exact.py) gets there in far fewer passes.

With one generator per image (`sampling.ImageGenerators`) a converged image
draws nothing more in its block: alone, its rounds would have stopped there. So
an image's codes do not depend on the images it is batched with, although a
batch runs as many rounds as its slowest image needs.
"""

from __future__ import annotations

import torch

from ..heads import DraftHeads
from ..sampling import verify_round
from .base import Block, DecodeRun, DecodingStrategy, RoundCounter
from .frontier import FrontierRun, check_window
from .options import VERIFY_ROUNDS, VERTICAL_ROWS, WINDOW


class SSDDecoding(DecodingStrategy):
    """The paper's decoding: horizontal heads for the first row, vertical heads for the rest, r rounds."""

    name = "ssd"
    summary = "lossy, fastest: the paper's SSD, verify_rounds verification rounds per row"
    lossless = False
    needs_heads = True
    options = (VERIFY_ROUNDS, VERTICAL_ROWS, WINDOW)

    def __init__(
        self,
        heads: DraftHeads,
        verify_rounds: int | None = VERIFY_ROUNDS.default,
        vertical_rows: int = VERTICAL_ROWS.default,
        horizontal_cells: int | None = None,
        window: int | None = None,
    ):
        """verify_rounds: the most verification rounds a block gets (None: no cap, which is `exact`).
        window: pipeline the rows on `exact`'s sliding window of this many positions, each cell verified at
        most verify_rounds times (see `FrontierRun`); None decodes the paper's blocks."""
        if verify_rounds is not None and verify_rounds < 0:
            raise ValueError(f"verify_rounds must be >= 0 (0 commits drafts unverified), got {verify_rounds}.")
        if heads.drafter != "cell" and vertical_rows != 1:
            raise ValueError(
                f"these heads' {heads.drafter!r} vertical drafter drafts one row from the committed row above: pass "
                f"vertical_rows=1, not {vertical_rows} (several rows at once need per-cell heads)."
            )
        if not 1 <= vertical_rows <= heads.max_vertical:
            raise ValueError(
                f"vertical_rows must be in 1..{heads.max_vertical} (the heads' vertical offsets), got {vertical_rows}."
            )
        check_window(window)
        if window is not None and vertical_rows != 1:
            raise ValueError(
                f"a window drafts each cell from the one above it: pass vertical_rows=1, not {vertical_rows}, "
                "or window=None for blocks of vertical_rows rows."
            )
        horizontal_cells = heads.max_horizontal if horizontal_cells is None else horizontal_cells
        if not 0 <= horizontal_cells <= heads.max_horizontal:
            raise ValueError(
                f"horizontal_cells must be in 0..{heads.max_horizontal} (the heads' horizontal offsets), got {horizontal_cells}."
            )
        self.heads = heads
        self.verify_rounds = verify_rounds
        self.vertical_rows = vertical_rows  # k_v
        self.horizontal_cells = horizontal_cells  # k_h
        self.window = window

    @property
    def round_cap(self) -> int | None:
        return self.verify_rounds

    def plan_blocks(self, grid) -> list[Block]:
        """First row in chunks of 1 + k_h cells, then k_v rows at a time."""
        step = 1 + self.horizontal_cells
        blocks = [Block(grid, x, min(x + step, grid.cols)) for x in range(0, grid.cols, step)]
        for row in range(1, grid.rows, self.vertical_rows):
            blocks.append(Block(grid, row * grid.cols, min(row + self.vertical_rows, grid.rows) * grid.cols))
        return blocks

    def max_rounds(self, block: Block) -> int:
        """With no cap, n + 1 rounds suffice: after round k the first k cells of a block never change again."""
        return block.num_cells + 1 if self.verify_rounds is None else self.verify_rounds

    def _decode(self, run: DecodeRun) -> None:
        self.heads.check_compatible(run.backbone)
        if self.window is not None:
            FrontierRun(run, self.heads, self.window, self.verify_rounds, self.horizontal_cells).decode()
            return
        state, h_next = run.prefill()  # h_next: [B', d], predicts the first cell of the next block
        blocks = self.plan_blocks(run.grid)
        rounds = RoundCounter()
        # z of the last committed row, [h; e]: [B', C, d_h] and [B', C, d_e]
        row_hidden = h_next.new_zeros(h_next.shape[0], run.grid.cols, run.backbone.hidden_size)
        row_embeds = h_next.new_zeros(h_next.shape[0], run.grid.cols, run.backbone.embed_size)
        for index, block in enumerate(blocks):
            if block.first_row == 0:
                codes, q = self._draft_right(run, block, h_next)
            else:
                codes, q = self._draft_below(run, block, h_next, row_hidden, row_embeds)
            is_last = index == len(blocks) - 1
            codes, final_round, committed = self._verify(
                run, state, block, h_next, codes, q, rounds, commit=not is_last
            )
            run.codes[:, block.first : block.end] = codes
            run.final_round[:, block.first : block.end] = final_round
            if committed is not None:
                hidden, block_hidden = committed
                h_next = hidden[:, -1]
                cells, cols = block.last_row_slice()
                row_hidden[:, cols] = block_hidden[:, cells]
                row_embeds[:, cols] = run.embed_codes(codes[:, cells])
            if block.end % run.grid.cols == 0:
                run.rows_committed(block.last_row)
            if run.stopped:
                break
        rounds.write_to(run.stats)

    def _draft_right(self, run: DecodeRun, block: Block, h_next: torch.Tensor):
        """First-row block: sample its first cell exactly, draft the rest with the horizontal heads."""
        p_first = run.probs(h_next)  # [B, K]
        first = run.sample(p_first)  # [B]
        if block.num_cells == 1:
            return first[:, None], p_first[:, None]
        drafted = self.heads.draft_right(h_next, run.embed_codes(first), block.num_cells - 1)  # [B', n-1, d]
        q_rest = run.probs(drafted)  # [B, n-1, K]
        codes = torch.cat([first[:, None], run.sample(q_rest)], dim=1)
        return codes, torch.cat([p_first[:, None], q_rest], dim=1)

    def _draft_below(self, run: DecodeRun, block: Block, h_next, row_hidden, row_embeds):
        """Whole-row block: the vertical heads draft every cell from the row above; the first cell is exact."""
        if self.heads.in_row:
            return self._draft_in_row(run, h_next, row_hidden, row_embeds)
        rows = block.last_row - block.first_row + 1
        drafted = self.heads.draft_below(row_hidden, row_embeds, rows).flatten(1, 2)  # [B', rows * C, d]
        drafted[:, 0] = h_next  # the first cell's distribution is known exactly
        q = run.probs(drafted)  # [B, n, K]
        return run.sample(q), q

    def _draft_in_row(self, run: DecodeRun, h_next, row_hidden, row_embeds):
        """One row, left to right: the first cell exact from h_next, then each cell x from the row above and the
        codes drawn at x - 1..x - left_codes (the first cell's included). Every q is what its code was drawn from."""
        heads, cols = self.heads, run.grid.cols
        context = heads.row_context(row_hidden, row_embeds)  # [B', C, d_h]
        q_first = run.probs(h_next)  # [B, K]
        codes, qs = [run.sample(q_first)], [q_first]
        batch, width = row_embeds.shape[0], heads.config.left_codes
        off_row = torch.ones(batch, width, dtype=torch.bool, device=row_embeds.device)  # at x = 0 every x - j is off
        left = heads.start_embeds(row_embeds.new_zeros(batch, width, row_embeds.shape[-1]), off_row)  # [B', L, d_e]
        state = h_next if heads.reads_left_state else None  # "recurrent": cell 1 reads the true state of cell 0
        for x in range(1, cols):
            left = torch.cat([run.embed_codes(codes[-1])[:, None].to(left.dtype), left[:, :-1]], dim=1)  # e(x-1) first
            drafted = heads.draft_step(context[:, x], left, state)  # [B', d_h]
            q = run.probs(drafted.to(h_next.dtype))  # [B, K]
            codes.append(run.sample(q))
            qs.append(q)
            state = drafted if state is not None else None  # and each later cell the draft to its left
        return torch.stack(codes, dim=1), torch.stack(qs, dim=1)

    def _verify(self, run: DecodeRun, state, block: Block, h_before, codes, q, rounds: RoundCounter, commit: bool):
        """Verification rounds, then the commit pass. Returns the final codes, each cell's final round
        (see `DecodeOutput`) and, if committed, (output hidden [B', n_pos, d], hidden predicting each cell
        [B', n_cells, d])."""
        start = state.length
        converged = torch.zeros(codes.shape[0], dtype=torch.bool, device=codes.device)  # [B]
        final_round = torch.ones_like(codes)  # [B, n]: drafted codes, held since round 1
        final_round[:, 0] = 0  # the first cell is drawn from its exact target
        images = torch.arange(codes.shape[0], device=codes.device)
        for round_index in range(self.max_rounds(block)):
            hidden = run.forward(state, block, codes)
            block_hidden = block.predicting_hidden(h_before, hidden)
            p = run.probs(block_hidden)  # [B, n, K]
            # With one generator per image, a converged image draws nothing more in this block, as when run alone.
            drawing = torch.where(converged, -1, images)
            new_codes, q, accepted = verify_round(codes, q, p, run.generator, drawing)
            # A sample whose round rejected nothing is final: later rounds would accept it with probability 1.
            active = ~converged
            codes = torch.where(active[:, None], new_codes, codes)
            final_round = torch.where(active[:, None] & ~accepted, round_index + 2, final_round)
            # The first cell is drawn from its exact target and always accepted: it is not counted as drafted.
            rounds.add(round_index, active.sum() * (block.num_cells - 1), (accepted[:, 1:] & active[:, None]).sum())
            converged |= accepted.all(dim=1)
            if bool(converged.all()):
                return codes, final_round, (hidden, block_hidden)  # this pass saw the final codes: the commit
            run.backbone.rewind(state, start)
        if not commit:
            return codes, final_round, None  # the last block: nothing reads its cache or hidden states
        hidden = run.forward(state, block, codes)
        return codes, final_round, (hidden, block.predicting_hidden(h_before, hidden))
