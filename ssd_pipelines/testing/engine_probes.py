"""The engine's insides as a measurement sees them: the one place outside decoding/ that names its private steps.

A benchmark that times one phase of a strategy (its drafting, one row's draft) or builds a pass's input reaches it
here, so that the engine can rename a step and fix one file, and `ssd_bench` reads the library only through its
public API and this package. `both_branches` is here for the same reason: the codes a batch's two guidance branches
share, as the engine lays them out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ..backbones.base import ImageBackbone, PromptBatch
from ..decoding.block import Block
from ..decoding.frontier import FrontierRun
from ..decoding.run import DecodeRun, both_branches
from ..decoding.ssd import SSDDecoding
from ..heads import DraftHeads
from ..sampling_config import SamplingConfig

__all__ = ["both_branches", "drafting_clock", "grid_embeds", "ssd_row_draft"]

# the strategies' drafting steps; `exact`'s re-proposals call the drafter too
DRAFTING_METHODS = (
    (SSDDecoding, "_draft_below"),
    (SSDDecoding, "_draft_right"),
    (FrontierRun, "_draft"),
    (FrontierRun, "_repropose"),
)


@contextmanager
def drafting_clock():
    """Seconds spent in the strategies' drafting steps (heads, their output head, sampling), while it is open.

    A benchmark's instrument: it wraps the drafting methods of the classes, and restores them on exit."""
    spent = [0.0]
    originals = [(cls, name, getattr(cls, name)) for cls, name in DRAFTING_METHODS]

    def timed(method):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        return run

    for cls, name, method in originals:
        setattr(cls, name, timed(method))
    try:
        yield spent
    finally:
        for cls, name, method in originals:
            setattr(cls, name, method)


def grid_embeds(backbone: ImageBackbone, codes: torch.Tensor, first: int, end: int, guidance: bool) -> torch.Tensor:
    """What a pass over cells [first, end) of the grid reads: codes [B, end - first] embedded with the end-of-line
    tokens in place, for both guidance branches -> [B', positions, d_e]."""
    return Block(backbone.grid, first, end).embed(backbone, both_branches(codes, guidance))


def ssd_row_draft(
    heads: DraftHeads, backbone: ImageBackbone, batch: PromptBatch, sampling: SamplingConfig, seed: int = 0
) -> Callable[[], None]:
    """One call of block `ssd`'s row draft (`SSDDecoding._draft_below`: the drafter, the backbone's output head and
    sampling, an in-row drafter left to right) for the grid's second row, from random states: a step to time."""
    grid = backbone.grid
    run = DecodeRun(backbone, batch, grid, sampling, None, None, "ssd")
    generator = torch.Generator(backbone.device).manual_seed(seed)
    branches = batch.input_ids.shape[0]
    row_hidden = torch.randn(
        branches, grid.cols, backbone.hidden_size, generator=generator, device=backbone.device, dtype=backbone.dtype
    )
    codes = torch.randint(0, grid.codebook_size, (1, grid.cols), generator=generator, device=backbone.device)
    row_embeds, h_next = run.embed_codes(codes), row_hidden[:, -1].clone()
    noise = torch.rand(1, grid.cols, generator=generator, device=backbone.device)
    block, ssd = Block(grid, grid.cols, 2 * grid.cols), SSDDecoding(heads, verify_rounds=0)
    return lambda: ssd._draft_below(run, block, h_next, row_hidden, row_embeds, noise)
