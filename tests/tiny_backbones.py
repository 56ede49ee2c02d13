"""Tiny random instances of the published backbones (`ssd_pipelines.tiny_published`, where `ssd-bench quantization`
finds them too), and a Chameleon VQGAN tokenizer written in Meta's layout for Lumina-mGPT."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from transformers import ChameleonConfig, ChameleonVQVAE, JanusConfig, JanusVQVAE

from ssd_pipelines.tiny_published import image_token_name, tiny_emu3, tiny_janus, tiny_lumina

__all__ = [
    "VQGANShape",
    "image_token_name",
    "reference_vqgan",
    "tiny_emu3",
    "tiny_janus",
    "tiny_lumina",
    "write_chameleon_tokenizer",
]


@dataclass(frozen=True)
class VQGANShape:
    """A taming-transformers VQGAN yaml's shape: `attention` puts attention blocks at the lowest resolution."""

    levels: int = 2
    codebook_size: int = 12
    resolution: int = 16
    attention: bool = True

    def params(self) -> dict:
        lowest = self.resolution // 2 ** (self.levels - 1)
        ddconfig = {
            "double_z": False,
            "z_channels": 8,
            "resolution": self.resolution,
            "in_channels": 3,
            "out_ch": 3,
            "ch": 32,
            "ch_mult": [1] * self.levels,
            "num_res_blocks": 1,
            "attn_resolutions": [lowest] if self.attention else [],
            "dropout": 0.0,
        }
        return {"embed_dim": 4, "n_embed": self.codebook_size, "ddconfig": ddconfig, "lossconfig": {"target": "x"}}


def reference_vqgan(shape: VQGANShape, seed: int = 0) -> tuple[ChameleonVQVAE, JanusVQVAE]:
    """Two transformers implementations of a taming VQGAN with random weights: Chameleon's encoder and
    quantizer, and Janus's decoder (the same architecture when attention sits at the lowest resolution)."""
    dd = shape.params()["ddconfig"]
    common = {
        "embed_dim": 4,
        "num_embeddings": shape.codebook_size,
        "latent_channels": dd["z_channels"],
        "in_channels": 3,
        "base_channels": dd["ch"],
        "channel_multiplier": dd["ch_mult"],
        "num_res_blocks": dd["num_res_blocks"],
    }
    torch.manual_seed(seed)
    encoder = ChameleonVQVAE._from_config(
        ChameleonConfig(
            vq_config={**common, "resolution": shape.resolution, "attn_resolutions": dd["attn_resolutions"]}
        ).vq_config
    ).eval()
    janus = JanusConfig(vq_config={**common, "out_channels": 3}).vq_config
    decoder = JanusVQVAE._from_config(janus).eval()
    with torch.no_grad():  # random weights at a scale where every layer matters
        for module in (encoder, decoder):
            for parameter in module.parameters():
                parameter.normal_(0, 0.2)
    return encoder, decoder


def write_chameleon_tokenizer(folder: Path, shape: VQGANShape, seed: int = 0, suffix: str = "ckpt") -> dict:
    """Write vqgan.yaml and vqgan.ckpt in Meta's layout (taming key names under "state_dict", a training-only
    "loss." entry included); returns the reference modules the weights came from."""
    encoder, decoder = reference_vqgan(shape, seed)
    state = {k: v for k, v in encoder.state_dict().items() if not k.startswith("decoder.")}
    levels = shape.levels
    for key, value in decoder.state_dict().items():
        if key.startswith("decoder."):
            parts = key.split(".")
            if parts[1] == "up":  # Janus lists the decoder's levels from the bottom, taming from the top
                parts[2] = str(levels - 1 - int(parts[2]))
                if parts[3] == "attn" and not shape.attention:
                    continue  # Janus always has them; a yaml without attn_resolutions has none
            state[".".join(parts)] = value
        elif key.startswith("post_quant_conv."):
            state[key] = value
    state["loss.discriminator.main.0.weight"] = torch.zeros(1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(yaml.safe_dump({"model": {"target": "VQModel", "params": shape.params()}}))
    if suffix == "ckpt":
        torch.save({"state_dict": state, "epoch": 3}, folder / "vqgan.ckpt")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, folder / "vqgan.safetensors")
    return {"encoder": encoder, "decoder": decoder}
