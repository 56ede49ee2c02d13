"""An enumerable grid and its exact AR distribution: the fixture of the exactness tests and `ssd-bench exactness`.

On a 2 x 3 grid of 3 codes there are 3^6 = 729 images. Their exact AR probabilities come from one teacher-forced
pass over all of them, through the same sampling path the strategies use (guidance, temperature). A strategy's
draws are compared with them two ways: the total-variation distance, and a likelihood-ratio (G) test, which sees
a small bias spread over many images that TV hides in its noise.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backbones.base import ImageBackbone, PromptBatch
from ..decoding import DecodingStrategy
from ..decoding.block import Block
from ..decoding.run import both_branches
from ..sampling import target_probs
from ..sampling_config import SamplingConfig
from . import tiny_backbone, tiny_heads

TOY_PROMPT = "a"


def toy_setup(rows: int = 2, cols: int = 3, codebook_size: int = 3, eol: bool = True, horizontal: int = 5):
    """The random backbone and heads of the exactness checks: peaked, context-dependent conditionals."""
    backbone = tiny_backbone(
        rows=rows, cols=cols, codebook_size=codebook_size, eol=eol, hidden_size=16, layers=1, init_scale=0.3
    )
    return backbone, tiny_heads(backbone, horizontal=tuple(range(1, horizontal + 1)))


def grid_index(codes: torch.Tensor, codebook_size: int) -> torch.Tensor:
    """Codes [N, R, C] -> the index of each grid among all codebook_size^(R*C) grids, raster order base K."""
    flat = codes.flatten(1)
    weights = codebook_size ** torch.arange(flat.shape[1] - 1, -1, -1, device=flat.device)
    return (flat * weights).sum(-1)


Encode = Callable[[int, bool], PromptBatch]
"""encode(images, guidance): the prompt batch of `images` images of the grid under test."""


def prompt_of(backbone: ImageBackbone, prompt: str) -> Encode:
    """The batch of one prompt, repeated: the grid is the backbone's."""
    return lambda images, guidance: backbone.encode_prompts([prompt], num_images_per_prompt=images, guidance=guidance)


@torch.inference_mode()
def grid_probabilities(backbone: ImageBackbone, prompt: str | Encode, sampling: SamplingConfig) -> torch.Tensor:
    """Exact AR probability of every grid, indexed as `grid_index`. -> [K^(R*C)]
    prompt: a prompt of the backbone's grid, or what encodes the batch (`Encode`: a grid of its own, a prefix)."""
    encode = prompt_of(backbone, prompt) if isinstance(prompt, str) else prompt
    grid = encode(1, False).grid or backbone.grid
    grids = torch.tensor(list(itertools.product(range(grid.codebook_size), repeat=grid.num_cells)))  # [G, n]
    prompts = encode(len(grids), sampling.uses_guidance)
    state, h_first = backbone.prefill(prompts)
    block = Block(grid, 0, grid.num_cells)
    hidden = backbone.extend(state, block.embed(backbone, both_branches(grids, sampling.uses_guidance)))
    p = target_probs(backbone.code_logits(block.predicting_hidden(h_first, hidden)), sampling)  # [G, n, K]
    return p.gather(-1, grids[..., None]).squeeze(-1).prod(-1)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@dataclass(frozen=True)
class GTest:
    """G = 2 sum O ln(O / E) over images (those expected fewer than 5 times pooled into one bin): chi-square
    with `df` degrees of freedom under exactness. `bound` is its 1 - 3e-6 quantile (Wilson-Hilferty)."""

    statistic: float
    df: int

    @property
    def bound(self) -> float:
        z = 4.5
        return self.df * (1 - 2 / (9 * self.df) + z * math.sqrt(2 / (9 * self.df))) ** 3

    @property
    def passes(self) -> bool:
        return self.statistic < self.bound


def g_test(counts: torch.Tensor, probs: torch.Tensor) -> GTest:
    """Likelihood-ratio test of observed counts [G] against exact probabilities [G]."""
    observed, expected = counts.double(), probs.double() * counts.sum().double()
    common = expected >= 5
    observed = torch.cat([observed[common], observed[~common].sum()[None]])
    expected = torch.cat([expected[common], expected[~common].sum()[None]])
    terms = torch.where(observed > 0, observed * (observed / expected).log(), torch.zeros_like(observed))
    return GTest(float(2 * terms.sum()), int(common.sum()))


def noise_floor(probs: torch.Tensor, samples: int, repeats: int = 20, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of the TV distance of an exact sampler drawing `samples` grids."""
    generator = torch.Generator().manual_seed(seed)
    distances = []
    for _ in range(repeats):
        draws = torch.multinomial(probs, samples, replacement=True, generator=generator)
        distances.append(total_variation(torch.bincount(draws, minlength=len(probs)) / samples, probs))
    return statistics.mean(distances), statistics.stdev(distances)


@dataclass
class ExactnessRow:
    label: str
    total_variation: float
    g: GTest
    forward_passes: int
    acceptance_per_round: list[float]


def measure(
    strategy: DecodingStrategy,
    backbone: ImageBackbone,
    sampling: SamplingConfig,
    samples: int,
    seed: int,
    probs: torch.Tensor,
    label: str | None = None,
    prompt: str | Encode = TOY_PROMPT,
) -> ExactnessRow:
    """Draw `samples` grids in one batch and compare their frequencies with `probs` (prompt: as
    `grid_probabilities` was given)."""
    encode = prompt_of(backbone, prompt) if isinstance(prompt, str) else prompt
    prompts = encode(samples, sampling.uses_guidance)
    grid = prompts.grid or backbone.grid
    out = strategy.decode(backbone, prompts, sampling, generator=torch.Generator().manual_seed(seed), grid=grid)
    counts = torch.bincount(grid_index(out.codes, grid.codebook_size), minlength=len(probs))
    return ExactnessRow(
        label or strategy.name,
        total_variation(counts / samples, probs),
        g_test(counts, probs),
        out.stats.forward_passes,
        out.stats.acceptance_per_round,
    )
