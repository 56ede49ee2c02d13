"""Lossless SSD: the sliding-window engine (frontier.py) with no cap on verifications (docs/decoding.md)."""

from __future__ import annotations

from ..heads import DraftHeads
from .base import DecodeRun, DecodingStrategy
from .frontier import FrontierRun, check_window
from .options import WINDOW


class ExactDecoding(DecodingStrategy):
    """Lossless: returns exactly the AR distribution, at most one pass per image position and usually far fewer."""

    name = "exact"
    summary = "lossless: the same distribution as ar (a different sample of it), in fewer passes"
    lossless = True
    needs_heads = True
    options = (WINDOW,)

    def __init__(self, heads: DraftHeads, window: int | None = None):
        """window: positions each pass runs per image (one row, end-of-line included, when None)."""
        check_window(window)
        self.heads = heads
        self.window = window

    def _decode(self, run: DecodeRun) -> None:
        self.heads.check_compatible(run.backbone)
        FrontierRun(run, self.heads, self.window or run.grid.row_length).decode()
