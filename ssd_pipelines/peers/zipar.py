"""ZipAR (He et al., ICML 2025): training-free; the next row starts once w cells of the row above are done. Lossy.

Follows `decode_n_tokens_zipar` in `LlamaGen-ZipAR/autoregressive/models/generate_zipar.py`
and the ZipAR mask of `Lumina-mGPT-ZipAR/lumina_mgpt/model/chameleon/modeling_chameleon.py`
(`_update_causal_mask_ZIPAR`) in ThisisBillhe/ZipAR. Spatially distant codes
hardly depend on each other, so row y + 1 need not wait for row y to end: once
row y has w cells, every pass runs one token per active row (its latest code, at
its own position) and samples the next cell of every active row. Cell (y, x) is
drawn at pass y * w + x, so an R x C grid takes (R - 1) * w + C passes (the
prefill counted) instead of R * C. Nothing is verified: a cell is drawn without
seeing the cells of the rows above that are not decoded yet.

Each token attends to every decoded token at an earlier position (the prompt,
the rows above as far as they got, its own row). The first cell of row y + 1 is
predicted at the position just before it: from the end-of-line token there,
or, in a grid without one, from a stand-in, the latest code of row y (ZipAR's
auxiliary token). When row y ends, its last code (and its end-of-line token) is
run again with the whole row in view, replacing the stand-in's cache entry.

What differs: w defaults to a third of a row, the ratio of the published
settings (16 of 48 on Lumina-mGPT, 8 of 24 on LlamaGen at 384 px); images of a
batch advance in lockstep (the schedule is fixed, as in ZipAR); sampling is the
project's one path. `final_round` is 0 for the first row (plain AR) and 1 for
the rest (drawn in an incomplete context, never verified).
"""

from __future__ import annotations

import math

import torch

from ..backbones.base import ImageGrid
from ..decoding.output import UNDECODED
from ..decoding.run import DecodeRun
from ..decoding.strategy import DecodingStrategy


class ZipARDecoding(DecodingStrategy):
    """Several rows per pass, each w cells behind the row above; no verification."""

    name = "zipar"  # its summary, lossless, needs_heads and options: catalog.py

    def __init__(self, window: int | None = None):
        """window: cells of a row decoded before the row below starts (default: a third of a row)."""
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive number of cells, got {window!r}.")
        self.window = window

    def cells_ahead(self, grid: ImageGrid) -> int:
        """w: how far each row runs ahead of the row below."""
        return min(self.window or math.ceil(grid.cols / 3), grid.cols)

    def num_passes(self, grid: ImageGrid) -> int:
        """(R - 1) * w + C: the pass that draws the last cell, the prefill counted."""
        return (grid.rows - 1) * self.cells_ahead(grid) + grid.cols

    def _decode(self, run: DecodeRun) -> None:
        grid, w = run.grid, self.cells_ahead(run.grid)
        state, h_first = run.prefill()
        run.codes[:, 0] = run.sample(run.probs(h_first))
        run.final_round[:, 0] = 0
        if grid.cols == 1:
            run.rows_committed(0)
        fed = torch.zeros(grid.sequence_length, dtype=torch.bool, device=run.codes.device)  # slots holding a token
        for t in range(1, self.num_passes(grid)):
            inputs, targets = self._schedule(grid, w, t)
            positions = torch.tensor(sorted(inputs), device=fed.device)  # [n], raster order
            fed[positions] = True
            slots = torch.arange(int(positions.max()) + 1, device=fed.device)
            visible = fed[slots] & (slots <= positions[:, None])  # [n, T]: decoded, and not after the token
            tokens = [inputs[int(s)] for s in positions]  # a code of a cell, or the end-of-line token
            fed_cells = torch.tensor([UNDECODED if kind == "eol" else cell for kind, cell in tokens], device=fed.device)
            embeds = run.embed_positions(run.codes[:, fed_cells.clamp_min(0)], fed_cells.expand(len(run.codes), -1))
            batch = embeds.shape[0]
            hidden = run.backbone.extend_at(
                state, embeds, positions.expand(batch, -1), visible.expand(batch, -1, -1)
            )  # [B', n, d]
            run.count_pass(len(positions))
            order = {int(s): i for i, s in enumerate(positions)}
            cells = torch.tensor([cell for _, cell in targets], device=fed.device)
            p = run.probs(hidden[:, [order[source] for source, _ in targets]])  # [B, m, K]
            run.codes[:, cells] = run.sample(p)
            run.final_round[:, cells] = (cells >= grid.cols).long()
            for cell in cells.tolist():
                if cell % grid.cols == grid.cols - 1:
                    run.rows_committed(cell // grid.cols)
            if run.stopped:
                return

    @staticmethod
    def _schedule(grid: ImageGrid, w: int, t: int):
        """Pass t's inputs {position: ("code", cell) or ("eol", None)} and targets [(predicting position, cell)]."""
        L = grid.row_length
        inputs: dict[int, tuple[str, int | None]] = {}
        targets: list[tuple[int, int]] = []
        for y in range(grid.rows):
            x = t - y * w  # the cell of row y drawn at this pass
            if 0 < x < grid.cols:
                inputs[y * L + x - 1] = ("code", y * grid.cols + x - 1)
                targets.append((y * L + x - 1, y * grid.cols + x))
            elif x == 0 and y > 0:  # the row starts: predicted from the position before it
                before = y * L - 1
                inputs[before] = ("eol", None) if grid.has_eol else ("code", (y - 1) * grid.cols + w - 1)
                targets.append((before, y * grid.cols))
            elif x == grid.cols and y < grid.rows - 1:  # the row ended last pass: its last code, with its row
                inputs[y * L + grid.cols - 1] = ("code", y * grid.cols + grid.cols - 1)
                if grid.has_eol:
                    inputs[y * L + grid.cols] = ("eol", None)
        return inputs, targets
