"""A quality measure that sees artefacts: a Fréchet distance on features of a classifier of the scenes.

FID compares Inception features of generated and real images. Inception knows
nothing of this world, so here a small network is trained on the procedural
scenes to tell which colours and shapes a scene holds and how many objects
(`training/quality_net.py`, docs/quality_network.md), and its penultimate
features stand in for Inception's. Stray fragments, blotches and broken shapes
move those features, while the GenEval-style evaluator, which only asks whether
the caption's objects are there, does not see them.

The weights ship beside this file (`quality_net.safetensors`, float16, loaded
with safetensors only).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from .scenes import COLORS, HELDOUT_SEED_START, SHAPES, SceneSpec, sample_scene

WEIGHTS = Path(__file__).with_name("quality_net.safetensors")
MAX_OBJECTS = 4  # scenes hold 1 to 4 objects
FEATURES = 64  # width of the features the Fréchet distance compares


def scene_targets(spec: SceneSpec) -> torch.Tensor:
    """What the classifier learns of a rendered scene: colours present [8], shapes present [4], objects - 1 [1]."""
    colours = torch.tensor([any(o.color == c for o in spec.rendered) for c in COLORS], dtype=torch.float32)
    shapes = torch.tensor([any(o.shape == s for o in spec.rendered) for s in SHAPES], dtype=torch.float32)
    return torch.cat([colours, shapes, torch.tensor([len(spec.rendered) - 1], dtype=torch.float32)])


class SceneClassifier(nn.Module):
    """64 x 64 RGB in [0, 1] -> features [FEATURES] -> colour and shape logits, object-count logits."""

    def __init__(self) -> None:
        super().__init__()
        widths = (3, 16, 32, 64, 128)
        layers: list[nn.Module] = []
        for c_in, c_out in itertools.pairwise(widths):  # each halves the side: 64 -> 4
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.GroupNorm(8, c_out), nn.SiLU()]
        self.trunk = nn.Sequential(*layers)
        self.embed = nn.Linear(widths[-1], FEATURES)
        self.attributes = nn.Linear(FEATURES, len(COLORS) + len(SHAPES))
        self.count = nn.Linear(FEATURES, MAX_OBJECTS)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Images [N, 3, 64, 64] in [0, 1] -> features [N, FEATURES]."""
        pooled = self.trunk(images * 2 - 1).mean(dim=(2, 3))  # [N, 128]
        return self.embed(pooled)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> attribute logits [N, 12] (colours, then shapes), count logits [N, MAX_OBJECTS]."""
        h = torch.nn.functional.silu(self.features(images))
        return self.attributes(h), self.count(h)


def load_quality_net(path: Path = WEIGHTS) -> SceneClassifier:
    """The shipped classifier, in float32, in eval mode."""
    net = SceneClassifier()
    net.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return net.eval()


def as_batch(images: Sequence[np.ndarray] | np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 HxWx3 arrays, float arrays in [0, 1], or a tensor [N, 3, H, W] in [0, 1] -> [N, 3, H, W] float."""
    if isinstance(images, torch.Tensor):
        return images.float()
    array = np.stack([np.asarray(image) for image in images])
    scale = 255.0 if array.dtype == np.uint8 else 1.0
    return torch.from_numpy(array.astype(np.float32) / scale).permute(0, 3, 1, 2)


@torch.inference_mode()
def image_features(net: SceneClassifier, images, batch_size: int = 256) -> np.ndarray:
    """Features [N, FEATURES] (float64) of images in any form `as_batch` takes."""
    batch = as_batch(images)
    return torch.cat([net.features(chunk) for chunk in batch.split(batch_size)]).double().numpy()


def heldout_features(net: SceneClassifier, renders: int) -> np.ndarray:
    """Features of real renders of the first `renders` held-out scenes: what generated images are compared with
    (the benchmarks' prompts are the first held-out captions, so their own renders are among them)."""
    return image_features(net, [sample_scene(HELDOUT_SEED_START + i).image for i in range(renders)])


def frechet_to_heldout(image_sets: Sequence, renders: int) -> list[float]:
    """The Fréchet distance of each set of generated images to the same `renders` real held-out renders."""
    net = load_quality_net()
    reference = heldout_features(net, renders)
    return [frechet_distance(image_features(net, images), reference) for images in image_sets]


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets [N, d]:
    |mu_a - mu_b|^2 + tr(S_a) + tr(S_b) - 2 tr((S_a^1/2 S_b S_a^1/2)^1/2)."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root_a = _psd_sqrt(s_a)
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(root_a @ s_b @ root_a), 0, None)).sum()
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2 * cross)


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    """Square root of a symmetric positive semi-definite matrix, through its eigendecomposition."""
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
