"""Pipeline output -> ComfyUI IMAGE, and the small preview ComfyUI shows on a node while it runs."""

from __future__ import annotations

import numpy as np
import PIL.Image
import torch

PREVIEW_SIDE = 512  # ComfyUI's default --preview-size


def to_comfy_images(images: np.ndarray) -> torch.Tensor:
    """The pipeline's "np" output [B, H, W, 3] in 0..1 -> IMAGE: a float32 CPU tensor of the same layout."""
    return torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))


def preview_image(image: PIL.Image.Image) -> PIL.Image.Image:
    """Enlarge a small image by a whole factor with nearest pixels, so its cells stay sharp on the node."""
    factor = max(1, PREVIEW_SIDE // max(image.size))
    return image.resize((image.width * factor, image.height * factor), PIL.Image.Resampling.NEAREST)
