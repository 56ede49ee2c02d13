"""Speculative Jacobi Decoding (Teng et al., ICLR 2025): training-free, lossless, a 1D window of random drafts.

Follows `SpeculativeSampler.__call__`, `get_multi_token_for_preparation` and
`prefix_matching_next_tokens` in `scheduler/jacobi_iteration_lumina_mgpt.py` of
tyshiwo1/Accelerating-T2I-AR-with-SJD. Each pass runs L tokens per image (the
last final token and L - 1 drafts, L = 16 as published):

- drafts enter the window as uniformly random codes whose q is one-hot on
  themselves (`multi_token_init_scheme='random'`);
- they are checked in order, each accepted with probability min(1, p/q), up to
  the first rejection, which is resampled from norm(max(0, p - q)); when all are
  accepted the position past the window is drawn from p (the bonus token);
- every cell past that point is drawn again from this pass's p and carries that
  p as its q into the next pass (the Jacobi step), the cache beyond the
  committed tokens is dropped (here: overwritten by the next pass).

What differs: every image of a batch keeps its own frontier (the published
code commits the shortest accepted prefix of the batch, and runs batch 1 in
practice); the window starts at the first image code (the published code
runs a few plain AR steps first and the last ~10 tokens of Lumina-mGPT's image
as AR); end-of-line tokens are forced, never drafted (Lumina-mGPT's logits
processor forces them, which is the same); sampling (guidance, temperature,
top-k, top-p) is the project's one path, so drafts and targets are processed
alike.
"""

from __future__ import annotations

import torch

from ..sampling import RandomSource, uniform
from .window import WindowDecoding, WindowRun


def random_codes(
    count: int, codebook_size: int, generator: RandomSource, device, images: torch.Tensor | None = None
) -> torch.Tensor:
    """`count` codes drawn uniformly from the codebook, through the caller's generator. -> [count]
    images [count]: whose each code is, so that with one generator per image each draws its own."""
    return (uniform((count,), generator, device, images) * codebook_size).long().clamp_max(codebook_size - 1)


class SJDDecoding(WindowDecoding):
    """Lossless: random drafts, sequential acceptance up to the first rejection, the tail redrawn from p."""

    name = "sjd"  # its summary, lossless, needs_heads and options: catalog.py
    tail = "resample"

    def __init__(self, window: int = 16):
        """window: tokens each pass runs per image, the last final one included (published: 16)."""
        super().__init__(window)

    def draft(self, front: WindowRun, images: torch.Tensor, cells: torch.Tensor) -> None:
        codebook = front.grid.codebook_size
        codes = random_codes(len(cells), codebook, front.run.generator, cells.device, images)
        front.set_drafts(images, cells, codes, torch.nn.functional.one_hot(codes, codebook).float())
