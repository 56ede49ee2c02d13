"""Lossless SSD: the sliding-window engine (frontier.py) with no cap on verifications (docs/decoding.md)."""

from __future__ import annotations

from ..heads import DraftHeads
from .frontier import FrontierRun
from .options import WINDOW
from .run import DecodeRun
from .strategy import DecodingStrategy

REPROPOSE_POWER = 1.0
"""How far an in-row drafter's predicted change moves a re-checked cell's q (frontier.py, `_repropose`). 1 is exact
for a drafter whose predicted change is calibrated. Power 2 made up for drafters that underrate the left code (the
fewest passes with three of four drafters), and 3 overshot once one was trained longer. Power 1 took fewer passes
than no re-proposals with every drafter measured (docs/exact_recheck.md)."""


class ExactDecoding(DecodingStrategy):
    """Lossless: returns exactly the AR distribution, at most one pass per image position and usually far fewer."""

    name = "exact"  # its summary, lossless, needs_heads and options: catalog.py
    pads_batches = True

    def __init__(self, heads: DraftHeads, window: int | None = None, repropose: float = REPROPOSE_POWER):
        """window: positions each pass runs per image (one row, end-of-line included, when None). repropose: see
        `REPROPOSE_POWER` (0: re-check a cell against its last target, as with per-cell heads)."""
        WINDOW.check(self.name, window)
        self.heads = heads
        self.window = window
        self.repropose = repropose

    def _decode(self, run: DecodeRun) -> None:
        self.heads.check_compatible(run.backbone)
        FrontierRun(run, self.heads, self.window or run.grid.row_length, repropose=self.repropose).decode()
