"""`auto`: lossless, `exact` for small batches and `ar` for large ones (docs/decoding.md, "`auto`").

`exact` and `ar` sample the same distribution, the model's own, so which one
decodes a batch changes the draw but not what is drawn. Speculative decoding
saves passes by running extra positions in each, which is nearly free while a
batch leaves the device idle and costs more than it saves once the batch fills
it: on this project's 2-core CPU `exact` is faster than `ar` per image alone and
slower from batches of 2 or 3 on (docs/decoding.md, "`auto`"). So `auto`
decodes a batch of at most `exact_max_batch` images (default 1) with `exact`, a
larger one with `ar`; a server measures its own crossover at start-up and
passes it. The choice follows the batch's size, so across the crossover an
image's codes depend on its batch even with one generator per image.
"""

from __future__ import annotations

from ..heads import DraftHeads
from .ar import ARDecoding
from .exact import ExactDecoding
from .options import EXACT_MAX_BATCH, WINDOW
from .run import DecodeRun
from .strategy import DecodingStrategy


class AutoDecoding(DecodingStrategy):
    """Lossless: `exact` (with `window`) for batches of at most `exact_max_batch` images, `ar` for larger ones.
    Its statistics name the one that decoded (`DecodeStats.chosen_decoding`)."""

    name = "auto"  # its summary, lossless, needs_heads and options: catalog.py
    pads_batches = True

    def __init__(self, heads: DraftHeads, exact_max_batch: int | None = EXACT_MAX_BATCH.default, window=None):
        """exact_max_batch: the largest batch (images, not guidance rows) decoded with `exact` (None: the default).
        window: `exact`'s window (see `ExactDecoding`)."""
        EXACT_MAX_BATCH.check(self.name, exact_max_batch)
        WINDOW.check(self.name, window)
        self.exact_max_batch = EXACT_MAX_BATCH.default if exact_max_batch is None else int(exact_max_batch)
        self.exact = ExactDecoding(heads, window=window)
        self.ar = ARDecoding()

    def choose(self, images: int) -> DecodingStrategy:
        """The strategy that decodes a batch of `images` images."""
        return self.exact if images <= self.exact_max_batch else self.ar

    def _decode(self, run: DecodeRun) -> None:
        chosen = self.choose(run.images)
        run.stats.chosen_decoding = chosen.name
        chosen._decode(run)
