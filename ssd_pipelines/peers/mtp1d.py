"""Our horizontal heads alone, as plain speculative decoding: the paper's 1D baseline, Medusa-style. Lossless.

Medusa (Cai et al. 2024) drafts the next few tokens from the last hidden state
with extra heads and verifies them in one pass with standard speculative
sampling: accept each draft with probability min(1, p/q) in order, resample the
first rejected one from norm(max(0, p - q)), take a bonus token from p when all
pass, and roll back everything after. Here the heads are SSD's horizontal heads
(`heads.py`): from [h; e] of the last final cell they draft the k_h cells to its
right, which the paper uses as its 1D baseline. They cannot draft across a row
end (their offsets are within a row), so a pass whose final cell is near the
row end drafts fewer cells; the end-of-line token is forced, and the next row's
first cell comes as the bonus when the window reaches it.

What differs from Medusa: one draft per offset (no tree of top candidates), and
the drafts are sampled from the heads' distributions rather than taken greedily,
so that acceptance min(1, p/q) keeps the AR distribution.
"""

from __future__ import annotations

import torch

from ..decoding.run import DecodeRun
from ..heads import DraftHeads
from .window import WindowDecoding, WindowRun


class MTP1DDecoding(WindowDecoding):
    """Lossless: k_h horizontal drafts per pass, verified in order, rolled back at the first rejection."""

    name = "mtp1d"  # its summary, lossless, needs_heads and options: catalog.py
    tail = "drop"
    needs_hidden = True

    def __init__(self, heads: DraftHeads, horizontal_cells: int | None = None):
        """horizontal_cells: cells drafted per pass (default: all the heads' horizontal offsets)."""
        horizontal_cells = heads.max_horizontal if horizontal_cells is None else horizontal_cells
        if not 1 <= horizontal_cells <= heads.max_horizontal:
            raise ValueError(
                f"horizontal_cells must be in 1..{heads.max_horizontal} (the heads' horizontal offsets), "
                f"got {horizontal_cells}."
            )
        super().__init__(window=1 + horizontal_cells)
        self.heads = heads
        self.horizontal_cells = horizontal_cells

    def _decode(self, run: DecodeRun) -> None:
        self.heads.check_compatible(run.backbone)
        super()._decode(run)

    def draft(self, front: WindowRun, images: torch.Tensor, cells: torch.Tensor) -> None:
        """Cells right of each image's last final cell, in its row, from that cell's [h; e]."""
        run, cols = front.run, front.grid.cols
        source = front.cell_at[front.final[images]]  # [n]: the final cell, UNDECODED at an end-of-line
        offset = cells - source
        can = (source >= 0) & (offset >= 1) & (offset <= self.horizontal_cells) & (cells // cols == source // cols)
        if not bool(can.any()):
            return
        images, cells, source, offset = images[can], cells[can], source[can], offset[can]
        rows = torch.cat([images, images + run.prompts.batch_size]) if run.prompts.guidance else images
        drafted = self.heads.draft_right(
            front.h_final[rows], run.embed_codes(run.codes[images, source]), self.horizontal_cells
        )
        drafted = drafted[torch.arange(len(rows), device=rows.device), front.both(offset) - 1]  # [B' / B * n, d]
        q = run.probs(drafted)  # [n, K]
        front.set_drafts(images, cells, run.sample(q, images), q)
