"""Image codes -> pixels through a diffusers `VQModel` (the reference model's tokenizer)."""

from __future__ import annotations

import torch
from diffusers import VQModel


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
