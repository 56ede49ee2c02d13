"""Forward passes against grid side n, for every strategy, with perfect and with random drafts.

On random-weight backbones (`ssd_pipelines.testing`) of n x n codes with end-of-line
tokens: AR takes n^2 passes; SSD's blocks are rows, so about n; windowed peers
save a constant factor of n^2 and ZipAR about a third. "Perfect drafts": a
backbone whose conditionals are uniform (`flat_backbone`), on which the heads'
drafts and uniformly random drafts with a uniform q are the model's own, so
nothing is rejected (SJD and GSD draft with a uniform q there, `with_uniform_drafts`;
their published one-hot q would be rejected most of the time). "Random drafts":
a backbone with peaked, context-dependent conditionals and untrained heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ssd_pipelines.decoding import STRATEGIES, SJDDecoding, make_strategy
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing import flat_backbone, tiny_backbone, tiny_heads, with_uniform_drafts

SIDES = (8, 16, 24, 32)
SETTINGS = ("perfect drafts", "random drafts")


def build(name: str, options: dict, heads, perfect: bool):
    """The strategy; on the flat backbone, SJD and GSD draft with a uniform q (see the module doc)."""
    cls = STRATEGIES[name]
    if perfect and issubclass(cls, SJDDecoding):
        return with_uniform_drafts(cls)(**options)
    return make_strategy(name, heads, **options)


def pass_counts(
    strategies: dict[str, tuple[str, dict]],
    sides: tuple[int, ...] = SIDES,
    images: int = 2,
    on_run: Callable[[], None] | None = None,
) -> dict[str, dict[str, dict[int, float]]]:
    """setting -> label -> side -> mean forward passes per call (batch of `images`, guidance 2, temperature 1)."""
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    counts: dict[str, dict[str, dict[int, float]]] = {s: {label: {} for label in strategies} for s in SETTINGS}
    for setting in SETTINGS:
        perfect = setting == "perfect drafts"
        for n in sides:
            make = flat_backbone if perfect else tiny_backbone
            backbone = make(rows=n, cols=n, codebook_size=16, hidden_size=32, layers=2)
            heads = tiny_heads(backbone)
            prompts = backbone.encode_prompts(["a red circle"], num_images_per_prompt=images, guidance=True)
            for label, (name, options) in strategies.items():
                strategy = build(name, options, heads, perfect)
                out = strategy.decode(backbone, prompts, sampling, generator=torch.Generator().manual_seed(n))
                counts[setting][label][n] = out.stats.forward_passes
                if on_run is not None:
                    on_run()
    return counts
