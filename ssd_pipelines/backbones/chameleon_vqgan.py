"""Meta's Chameleon image tokenizer, the VQ decoder of Lumina-mGPT, as a diffusers `VQModel`.

Meta ships the tokenizer as `tokenizer/vqgan.yaml` + `tokenizer/vqgan.ckpt` (a
taming-transformers VQGAN: 8,192 codes, 16x downsampling), behind a licence
form, and transformers' `ChameleonVQVAE` keeps only its encoder. Its
architecture is diffusers' `VQModel`'s, block for block, so this module builds
the `VQModel` the yaml describes and renames the checkpoint's keys into it; the
result is saved with `save_pretrained` (safetensors) and loaded as any pipeline
component from then on.

`vqgan.ckpt` is a torch pickle. It is read with `torch.load(weights_only=True)`,
which accepts tensors and plain containers only and never runs code from the
file; a `vqgan.safetensors` beside the yaml is preferred when present.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import yaml
from diffusers import VQModel
from safetensors.torch import load_file

CHAMELEON_DOWNLOAD = "https://ai.meta.com/resources/models-and-libraries/chameleon-downloads/"

# taming name -> diffusers name, applied in order to every key; "{up}" is the decoder level counted from the bottom.
_RENAMES = [
    (r"^(encoder|decoder)\.mid\.block_1\.", r"\1.mid_block.resnets.0."),
    (r"^(encoder|decoder)\.mid\.block_2\.", r"\1.mid_block.resnets.1."),
    (r"^(encoder|decoder)\.mid\.attn_1\.", r"\1.mid_block.attentions.0."),
    (r"^encoder\.down\.(\d+)\.block\.", r"encoder.down_blocks.\1.resnets."),
    (r"^encoder\.down\.(\d+)\.attn\.", r"encoder.down_blocks.\1.attentions."),
    (r"^encoder\.down\.(\d+)\.downsample\.", r"encoder.down_blocks.\1.downsamplers.0."),
    (r"^decoder\.up\.(\d+)\.block\.", "decoder.up_blocks.{up}.resnets."),
    (r"^decoder\.up\.(\d+)\.attn\.", "decoder.up_blocks.{up}.attentions."),
    (r"^decoder\.up\.(\d+)\.upsample\.", "decoder.up_blocks.{up}.upsamplers.0."),
    (r"\.norm_out\.", ".conv_norm_out."),
    (r"\.nin_shortcut\.", ".conv_shortcut."),
    (r"(attentions\.\d+)\.norm\.", r"\1.group_norm."),
    (r"(attentions\.\d+)\.(q|k|v)\.", r"\1.to_\2."),
    (r"(attentions\.\d+)\.proj_out\.", r"\1.to_out.0."),
]
_TRAINING_ONLY = ("loss.",)  # discriminator and perceptual-loss weights of a training checkpoint


def vqmodel_config(params: dict) -> dict:
    """The `VQModel` arguments for a VQGAN yaml's `model.params` (taming's ddconfig)."""
    dd = params["ddconfig"]
    if dd.get("double_z"):
        raise ValueError("this VQGAN encodes a mean and a variance (double_z: true): it is not a VQ tokenizer.")
    levels = len(dd["ch_mult"])
    attention = [dd["resolution"] // 2**level in dd.get("attn_resolutions", []) for level in range(levels)]
    return {
        "in_channels": dd["in_channels"],
        "out_channels": dd["out_ch"],
        "down_block_types": tuple("AttnDownEncoderBlock2D" if a else "DownEncoderBlock2D" for a in attention),
        "up_block_types": tuple("AttnUpDecoderBlock2D" if a else "UpDecoderBlock2D" for a in reversed(attention)),
        "block_out_channels": tuple(dd["ch"] * m for m in dd["ch_mult"]),
        "layers_per_block": dd["num_res_blocks"],
        "latent_channels": dd["z_channels"],
        "num_vq_embeddings": params["n_embed"],
        "vq_embed_dim": params["embed_dim"],
        "sample_size": dd["resolution"],
        "norm_num_groups": 32,  # taming's Normalize
    }


def convert_state_dict(state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """Taming-transformers VQGAN weights -> diffusers `VQModel` weights (levels: entries of ch_mult)."""
    converted = {}
    for key, tensor in state.items():
        if key.startswith(_TRAINING_ONLY):
            continue
        name = key
        for pattern, replacement in _RENAMES:
            match = re.search(pattern, name)
            if match and "{up}" in replacement:
                replacement = replacement.format(up=levels - 1 - int(match.group(1)))  # taming counts from the top
            name = re.sub(pattern, replacement, name)
        if ".attentions." in name and name.endswith(".weight") and tensor.ndim == 4:
            tensor = tensor[:, :, 0, 0]  # a 1x1 convolution is a linear layer
        converted[name] = tensor
    return converted


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a VQGAN checkpoint: safetensors, or a torch pickle read with weights_only=True."""
    if path.suffix == ".safetensors":
        return load_file(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint.get("state_dict", checkpoint)


def load_chameleon_vqgan(folder: str | Path) -> VQModel:
    """Meta's Chameleon VQGAN, in float32, from the folder holding `vqgan.yaml` and `vqgan.ckpt` (or
    `vqgan.safetensors`)."""
    folder = Path(folder)
    weights = [folder / name for name in ("vqgan.safetensors", "vqgan.ckpt") if (folder / name).is_file()]
    if not (folder / "vqgan.yaml").is_file() or not weights:
        raise ValueError(
            f"{folder} does not hold Meta's Chameleon image tokenizer (vqgan.yaml and vqgan.ckpt). Download "
            f"Chameleon from {CHAMELEON_DOWNLOAD} (licence form) and pass its tokenizer/ folder."
        )
    params = yaml.safe_load((folder / "vqgan.yaml").read_text())["model"]["params"]
    config = vqmodel_config(params)
    model = VQModel(**config)
    state = convert_state_dict(read_checkpoint(weights[0]), len(config["block_out_channels"]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{weights[0]} does not match {folder / 'vqgan.yaml'}: missing {sorted(missing)[:4]}, unexpected "
            f"{sorted(unexpected)[:4]}. Pass the vqgan.yaml and vqgan.ckpt that Meta ships together."
        )
    return model.eval()
