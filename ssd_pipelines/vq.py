"""Images <-> grids of codes through a diffusers `VQModel` (the reference model's tokenizer)."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import VQModel


def images_to_tensor(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [-1, 1], the VQModel's input range."""
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0


@torch.no_grad()
def encode_images(vq: VQModel, images: np.ndarray | torch.Tensor) -> torch.LongTensor:
    """uint8 images [B, H, W, 3] -> codebook indices [B, H/f, W/f]."""
    z = vq.encode(images_to_tensor(images).to(device=vq.device, dtype=vq.dtype)).latents
    _, _, (_, _, indices) = vq.quantize(z)
    return indices.reshape(z.shape[0], z.shape[2], z.shape[3]).long()


@torch.no_grad()
def decode_codes(vq: VQModel, codes: torch.Tensor) -> torch.Tensor:
    """Codebook indices [B, h, w] -> float32 images [B, 3, f*h, f*w] in [0, 1].

    Looks the vectors up with `quantize.get_codebook_entry` and decodes them with
    `force_not_quantize=True` (the vectors are already on the codebook).
    """
    if vq.config.lookup_from_codebook:
        raise ValueError("decode_codes expects a VQModel with lookup_from_codebook=False")
    b, h, w = codes.shape
    shape = (b, h, w, vq.config.vq_embed_dim or vq.config.latent_channels)
    quant = vq.quantize.get_codebook_entry(codes.reshape(-1).to(vq.device), shape)
    sample = vq.decode(quant, force_not_quantize=True).sample
    return ((sample.float() + 1.0) / 2.0).clamp(0.0, 1.0)
