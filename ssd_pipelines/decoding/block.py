"""A block of cells decoded together, as `ar` and block `ssd` lay the grid out, and its place in the image sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backbones.base import ImageBackbone, ImageGrid


@dataclass(frozen=True)
class Block:
    """Cells [first, end) of the grid in raster order, decoded together.

    A block spans positions of the flat image sequence: its cells, plus the forced
    end-of-line token after any row it completes. The backbone's output at each
    position predicts the next position, so the hidden state predicting the
    block's first cell comes from before the block (`h_before`).
    """

    grid: ImageGrid
    first: int
    end: int

    @property
    def num_cells(self) -> int:
        return self.end - self.first

    @property
    def first_row(self) -> int:
        return self.first // self.grid.cols

    @property
    def last_row(self) -> int:
        return (self.end - 1) // self.grid.cols

    def _position(self, cell):
        """Sequence position of a cell (an int, or a tensor of them)."""
        return (cell // self.grid.cols) * self.grid.row_length + cell % self.grid.cols

    def cell_positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Index of each cell among the block's sequence positions [n_cells], made on `device`: a pass indexes with
        them, and a copy from the host would make it wait."""
        return self._position(torch.arange(self.first, self.end, device=device)) - self._position(self.first)

    @property
    def num_positions(self) -> int:
        ends_row = self.end % self.grid.cols == 0
        last = self._position(self.end - 1) - self._position(self.first)
        return last + 1 + int(self.grid.has_eol and ends_row)

    def embed(self, backbone: ImageBackbone, codes: torch.Tensor) -> torch.Tensor:
        """Input embeddings of the block: codes [B', n_cells] with end-of-line tokens in place. -> [B', n_pos, d_e]"""
        code_embeds = backbone.embed_codes(codes)
        if self.num_positions == self.num_cells:
            return code_embeds
        eol = backbone.embed_token(self.grid.eol_token_id)
        embeds = eol.expand(codes.shape[0], self.num_positions, -1).clone()
        embeds[:, self.cell_positions(codes.device)] = code_embeds
        return embeds

    def predicting_hidden(self, h_before: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states predicting each cell: [B', d], [B', n_pos, d] -> [B', n_cells, d]."""
        shifted = torch.cat([h_before[:, None], hidden[:, :-1]], dim=1)  # position i is predicted by output i - 1
        return shifted[:, self.cell_positions(hidden.device)]

    def last_row_slice(self) -> tuple[slice, slice]:
        """(cells of this block in its last row, their columns): what the next row is drafted from."""
        start = max(self.first, self.last_row * self.grid.cols)
        return slice(start - self.first, self.num_cells), slice(
            start % self.grid.cols, (self.end - 1) % self.grid.cols + 1
        )
