"""Plain autoregressive decoding: the baseline every speedup is measured against.

One backbone pass per image code, KV-cached, both guidance branches in one
batch, with no read of the host. A forced end-of-line token rides in the same
pass as the code before it, so AR costs exactly R x C passes (the prefill yields
the first cell's distribution; the last code needs no pass after it). Nothing is
done per step that a fast AR loop would not do, or every ratio we publish would
be inflated.
"""

from __future__ import annotations

from ..sampling import sample_with
from .block import Block
from .run import DecodeRun
from .strategy import DecodingStrategy


class ARDecoding(DecodingStrategy):
    """The baseline. With record_hidden=True the output also carries the pre-norm hidden state
    predicting every cell, in both guidance branches: the training data of the drafting heads."""

    name = "ar"  # its summary, lossless, needs_heads and options: catalog.py
    pads_batches = True

    def __init__(self, record_hidden: bool = False):
        self.record_hidden = record_hidden

    def _decode(self, run: DecodeRun) -> None:
        grid = run.grid
        state, h_next = run.prefill()  # h_next: [B', d], predicts the next cell
        run.final_round.zero_()  # every cell is drawn from its exact distribution
        noise = run.noise_tape(1)  # what drawing cell by cell gives
        if self.record_hidden:
            run.hidden = h_next.new_empty(h_next.shape[0], grid.num_cells, h_next.shape[-1])
        for cell in range(grid.num_cells):
            if self.record_hidden:
                run.hidden[:, cell] = h_next
            run.codes[:, cell] = sample_with(run.probs(h_next), noise.next()[:, 0])
            row, col = divmod(cell, grid.cols)
            if col == grid.cols - 1:
                run.rows_committed(row)
            if cell == grid.num_cells - 1 or run.stopped:
                return
            block = Block(grid, cell, cell + 1)  # the code, and the end-of-line token if it ends a row
            h_next = run.forward(state, block, run.codes[:, cell : cell + 1])[:, -1]
