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

Each block draws its noise whole before its first round: the drafts', then an
acceptance and a residual draw per cell for every round it may run. With one
generator per image (`sampling.ImageGenerators`) an image's draws are thus the
same however many rounds its batch runs, and a converged image simply leaves the
rest unread: its codes do not depend on the images it is batched with, although a
batch runs as many rounds as its slowest image needs. The rounds read the host
once each, to learn whether every image has converged.
"""

from __future__ import annotations

import torch

from ..heads import DraftHeads
from ..sampling import sample_with, verify_with
from .block import Block
from .frontier import FrontierRun
from .options import VERIFY_ROUNDS, VERTICAL_ROWS, WINDOW
from .rounds import RoundCounter
from .run import DecodeRun
from .strategy import DecodingStrategy


class SSDDecoding(DecodingStrategy):
    """The paper's decoding: horizontal heads for the first row, vertical heads for the rest, r rounds."""

    name = "ssd"  # its summary, lossless, needs_heads and options: catalog.py
    pads_batches = True

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
        for option, value in ((VERIFY_ROUNDS, verify_rounds), (VERTICAL_ROWS, vertical_rows), (WINDOW, window)):
            option.check(self.name, value)  # the declaration's own check, as the pipeline's and every face's
        if not 1 <= vertical_rows <= heads.max_vertical:
            one_row = (
                f" These heads' {heads.drafter!r} vertical drafter drafts one row from the committed row above: pass "
                "vertical_rows=1 (several rows at once need per-cell heads with more vertical offsets)."
            )
            raise ValueError(
                f"vertical_rows must be in 1..{heads.max_vertical} (the heads' vertical offsets), got {vertical_rows}."
                + (one_row if heads.max_vertical == 1 else "")
            )
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
        """n + 1 rounds suffice: after round k the first k cells of a block never change again, so round n + 1
        rejects nothing. A cap beyond that changes nothing, not even the noise a block draws."""
        most = block.num_cells + 1
        return most if self.verify_rounds is None else min(self.verify_rounds, most)

    def _decode(self, run: DecodeRun) -> None:
        self.heads.check_compatible(run.backbone)
        if self.window is not None:
            FrontierRun(run, self.heads, self.window, self.verify_rounds, self.horizontal_cells).decode()
            return
        state, h_next = run.prefill()  # h_next: [B', d], predicts the first cell of the next block
        blocks = self.plan_blocks(run.grid)
        most_rounds = max(self.max_rounds(block) for block in blocks)
        rounds = RoundCounter(most_rounds, run.codes.device, run.runner.full)
        # z of the last committed row, [h; e]: [B', C, d_h] and [B', C, d_e]
        row_hidden = h_next.new_zeros(h_next.shape[0], run.grid.cols, run.backbone.hidden_size)
        row_embeds = h_next.new_zeros(h_next.shape[0], run.grid.cols, run.backbone.embed_size)
        for index, block in enumerate(blocks):
            # The block's noise, drawn whole: its drafts', then acceptance and residual draws for every round.
            noise = run.uniform((run.prompts.batch_size, 1 + 2 * self.max_rounds(block), block.num_cells))
            if block.first_row == 0:
                codes, q = self._draft_right(run, block, h_next, noise[:, 0])
            else:
                codes, q = self._draft_below(run, block, h_next, row_hidden, row_embeds, noise[:, 0])
            is_last = index == len(blocks) - 1
            codes, final_round, committed = self._verify(
                run, state, block, h_next, codes, q, noise[:, 1:], rounds, commit=not is_last
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

    def _draft_right(self, run: DecodeRun, block: Block, h_next: torch.Tensor, noise: torch.Tensor):
        """First-row block: sample its first cell exactly, draft the rest with the horizontal heads."""
        p_first = run.probs(h_next)  # [B, K]
        first = sample_with(p_first, noise[:, 0])  # [B]
        if block.num_cells == 1:
            return first[:, None], p_first[:, None]
        drafted = self.heads.draft_right(h_next, run.embed_codes(first), block.num_cells - 1)  # [B', n-1, d]
        q_rest = run.probs(drafted)  # [B, n-1, K]
        codes = torch.cat([first[:, None], sample_with(q_rest, noise[:, 1:])], dim=1)
        return codes, torch.cat([p_first[:, None], q_rest], dim=1)

    def _draft_below(self, run: DecodeRun, block: Block, h_next, row_hidden, row_embeds, noise: torch.Tensor):
        """Whole-row block: the vertical drafter drafts each row from the committed row above (`_draft_row`, one
        step compiled with the passes); the first cell is drawn from its exact distribution (h_next). Every q is
        what its code was drawn from. noise: [B, n], one draw per cell."""
        cols = run.grid.cols
        draft_row = run.runner.step(SSDDecoding._draft_row, "the row-drafting step")
        codes, qs = [], []
        for dy in range(1, block.last_row - block.first_row + 2):
            first = h_next if dy == 1 else None
            code, q = draft_row(self, run, row_hidden, row_embeds, first, noise[:, (dy - 1) * cols : dy * cols], dy)
            codes.append(code)
            qs.append(q)
        return torch.cat(codes, dim=1), torch.cat(qs, dim=1)

    def _draft_row(self, run: DecodeRun, row_hidden, row_embeds, h_first, noise: torch.Tensor, dy: int):
        """The row dy below the committed one -> its codes and q [B, C], [B, C, K], its first cell from h_first
        [B', d] when given. A drafter that reads the codes drawn to a cell's left goes left to right, a cell a step
        ("recurrent": each also reads the state predicting the cell to its left, h_first for the first cell's
        right neighbour); any other drafts the row at once. Its uniforms drawn beforehand, the whole row is one
        step of tensors: one graph, or one CUDA graph, however many cells it steps through."""
        drafter, cols = self.heads.vertical, run.grid.cols
        batch = row_embeds.shape[0]
        width = 1 if drafter.left_codes else cols  # cells a step
        context = drafter.context(row_hidden, row_embeds, dy)  # [B', C, d_h]
        left = state = None
        if drafter.left_codes:  # at x = 0 every x - j is off the row
            off_row = torch.ones(batch, drafter.left_codes, dtype=torch.bool, device=row_embeds.device)
            left = drafter.start_embeds(row_embeds.new_zeros(*off_row.shape, row_embeds.shape[-1]), off_row)
        if drafter.reads_left_state:
            state = torch.zeros_like(row_hidden[:, 0])
        codes, qs = [], []
        for x in range(0, cols, width):
            first = h_first is not None and x == 0  # the first cell's distribution is known exactly
            if first and width == 1:
                drafted = h_first[:, None]  # nothing to draft
            else:
                step_left = None if left is None else left[:, None]
                step_state = None if state is None else state[:, None]
                drafted = drafter.step(context[:, x : x + width], step_left, step_state, dy).to(row_hidden.dtype)
                if first:
                    drafted[:, 0] = h_first
            q = run.probs(drafted)  # [B, width, K]
            code = sample_with(q, noise[:, x : x + width])
            codes.append(code)
            qs.append(q)
            if left is not None:  # e(x - 1) first
                left = torch.cat([run.embed_codes(code[:, -1])[:, None].to(left.dtype), left[:, :-1]], dim=1)
            if state is not None:
                state = drafted[:, -1]
        return torch.cat(codes, dim=1), torch.cat(qs, dim=1)

    def _verify(self, run: DecodeRun, state, block: Block, h_before, codes, q, noise, rounds, commit: bool):
        """Verification rounds, then the commit pass. noise: [B, 2 * rounds, n], each round's acceptance draws then
        its residual draws. Returns the final codes, each cell's final round (see `DecodeOutput`) and, if committed,
        (output hidden [B', n_pos, d], hidden predicting each cell [B', n_cells, d])."""
        start = state.length
        converged = torch.zeros(codes.shape[0], dtype=torch.bool, device=codes.device)  # [B]
        final_round = torch.ones_like(codes)  # [B, n]: drafted codes, held since round 1
        final_round[:, 0] = 0  # the first cell is drawn from its exact target
        for round_index in range(self.max_rounds(block)):
            hidden = run.forward(state, block, codes)
            block_hidden = block.predicting_hidden(h_before, hidden)
            p = run.probs(block_hidden)  # [B, n, K]
            accept_noise, residual_noise = noise[:, 2 * round_index], noise[:, 2 * round_index + 1]
            new_codes, q, accepted = verify_with(codes, q, p, accept_noise, residual_noise)
            # A sample whose round rejected nothing is final: later rounds would accept it with probability 1.
            active = ~converged
            codes = torch.where(active[:, None], new_codes, codes)
            final_round = torch.where(active[:, None] & ~accepted, round_index + 2, final_round)
            # The first cell is drawn from its exact target and always accepted: it is not counted as drafted. Nor
            # are a padded batch's clones (`batch_buckets`).
            counted = active & run.real
            rounds.add_round(
                round_index, counted.sum() * (block.num_cells - 1), (accepted[:, 1:] & counted[:, None]).sum()
            )
            converged |= accepted.all(dim=1)
            if bool(converged.all()):  # the round's one read of the host
                return codes, final_round, (hidden, block_hidden)  # this pass saw the final codes: the commit
            run.backbone.rewind(state, start)
        if not commit:
            return codes, final_round, None  # the last block: nothing reads its cache or hidden states
        hidden = run.forward(state, block, codes)
        return codes, final_round, (hidden, block.predicting_hidden(h_before, hidden))
