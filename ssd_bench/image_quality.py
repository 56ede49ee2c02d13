"""What a decoding's images are worth: adherence per GenEval task, Fréchet distance to real renders, distance to AR.

- Adherence: the GenEval-style evaluator (`reference/evaluator.py`) on every image.
- Fréchet distance: features of the scene classifier (`reference/quality.py`) of
  the generated images against those of real renders of the same held-out
  captions, as FID does with Inception; it sees stray fragments and blotches
  that adherence does not.
- Token distance to AR: total variation between the histograms of codes the
  decoding and AR drew over the same prompts (0: the same code frequencies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ssd_pipelines.backbones.base import ImageBackbone
from ssd_pipelines.decoding import DecodingStrategy
from ssd_pipelines.reference.evaluator import evaluate
from ssd_pipelines.reference.quality import SceneClassifier, frechet_distance, image_features
from ssd_pipelines.reference.scenes import Scene
from ssd_pipelines.sampling_config import SamplingConfig


@dataclass
class GeneratedSet:
    """Every image one decoding drew for the held-out prompts (prompt-major), with its statistics."""

    codes: torch.Tensor  # [N, R, C]
    images: np.ndarray  # [N, H, W, 3] uint8
    passes: list[int] = field(default_factory=list)  # per call
    drafted: list[int] = field(default_factory=list)  # per verification round, summed over calls
    accepted: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted)]


def generate(
    strategy: DecodingStrategy,
    backbone: ImageBackbone,
    scenes: list[Scene],
    images_per_prompt: int,
    batch_size: int,
    sampling: SamplingConfig,
    on_call=None,
) -> GeneratedSet:
    """Draw `images_per_prompt` images per scene caption, `batch_size` images a call (the seed of each call is its
    first prompt's index, the same for every decoding)."""
    prompts_per_call = max(1, batch_size // images_per_prompt)
    codes, passes = [], []
    drafted: list[int] = []
    accepted: list[int] = []
    for start in range(0, len(scenes), prompts_per_call):
        chunk = scenes[start : start + prompts_per_call]
        batch = backbone.encode_prompts(
            [s.caption for s in chunk], num_images_per_prompt=images_per_prompt, guidance=sampling.uses_guidance
        )
        out = strategy.decode(backbone, batch, sampling, generator=torch.Generator().manual_seed(start))
        codes.append(out.codes)
        passes.append(out.stats.forward_passes)
        for totals, counts in ((drafted, out.stats.drafted_per_round), (accepted, out.stats.accepted_per_round)):
            totals.extend([0] * (len(counts) - len(totals)))
            for k, n in enumerate(counts):
                totals[k] += n
        if on_call is not None:
            on_call(len(chunk) * images_per_prompt)
    codes = torch.cat(codes)
    return GeneratedSet(codes, to_uint8(backbone.decode_codes(codes)), passes, drafted, accepted)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images [N, 3, H, W] in [0, 1] -> [N, H, W, 3] uint8."""
    return (images.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def code_histogram_distance(codes: torch.Tensor, baseline: torch.Tensor, codebook_size: int) -> float:
    """Total variation between the code frequencies of two sets of grids (any shapes)."""
    ours = torch.bincount(codes.flatten(), minlength=codebook_size).double()
    theirs = torch.bincount(baseline.flatten(), minlength=codebook_size).double()
    return 0.5 * float((ours / ours.sum() - theirs / theirs.sum()).abs().sum())


@dataclass
class Quality:
    adherence: float
    per_task: dict[str, float]
    frechet: float
    token_distance: float  # to AR


def judge(
    generated: GeneratedSet,
    scenes: list[Scene],
    images_per_prompt: int,
    net: SceneClassifier,
    reference_features: np.ndarray,
    baseline_codes: torch.Tensor,
    codebook_size: int,
) -> Quality:
    """Adherence, Fréchet distance to the real renders' features, and token distance to AR's codes."""
    specs = [s.spec for s in scenes for _ in range(images_per_prompt)]
    report = evaluate(list(generated.images), specs)
    return Quality(
        report["overall"],
        report["per_task"],
        frechet_distance(image_features(net, generated.images), reference_features),
        code_histogram_distance(generated.codes, baseline_codes, codebook_size),
    )
