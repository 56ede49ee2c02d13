"""Tiny random instances of the published backbones' real transformers classes, with word-level tokenizers.

Each vocabulary holds the special tokens the model's own pipeline looks up by
name, so adapters meet the same names as in the real checkpoints; image codes
sit where the real vocabularies put them (Chameleon's shuffled, so a test sees
whether the vocabulary map is followed). Weights are drawn at a large scale
(0.4) so that greedy decoding depends on context and a wrong position or token
changes the codes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    ChameleonConfig,
    ChameleonForConditionalGeneration,
    ChameleonVQVAE,
    Emu3Config,
    Emu3ForConditionalGeneration,
    JanusConfig,
    JanusForConditionalGeneration,
    JanusVQVAE,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

WORDS = ["a", "red", "blue", "dog", "cat", "in", "the", "rain", ":", "*", *map(str, range(10))]
SCALE = 0.4


def word_tokenizer(vocabulary: dict[str, int], specials: list[str], **roles: str) -> PreTrainedTokenizerFast:
    """A whitespace/punctuation word tokenizer over `vocabulary`; `specials` split text as the real ones do."""
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", **roles)
    fast.add_special_tokens({"additional_special_tokens": specials})
    return fast


def _text_config(vocab_size: int, bos: int, pad: int) -> dict:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=bos,
        eos_token_id=2,
        pad_token_id=pad,
        initializer_range=SCALE,
    ).to_dict()


def tiny_janus(side: int = 4, codebook_size: int = 12, seed: int = 0):
    """A `JanusForConditionalGeneration` writing side x side codes (2 px each) and its tokenizer."""
    specials = [
        "<pad>",
        "<unk>",
        "<bos>",
        "<eos>",
        "<begin_of_image>",
        "<image_placeholder>",
        "<|User|>",
        "<|Assistant|>",
    ]
    vocabulary = {token: i for i, token in enumerate(specials + WORDS)}
    vq = {
        "embed_dim": 4,
        "num_embeddings": codebook_size,
        "latent_channels": 32,
        "base_channels": 32,
        "channel_multiplier": [1, 1],
        "num_res_blocks": 1,
        "projection_dim": 32,
        "image_token_embed_dim": 32,
        "initializer_range": SCALE,
    }
    vision = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 4 * side,
        "patch_size": 4,
        "projection_dim": 32,
        "num_image_tokens": side * side,
        "mlp_ratio": 2,
    }
    config = JanusConfig(
        text_config=_text_config(len(vocabulary), bos=2, pad=0),
        vision_config=vision,
        vq_config=vq,
        image_token_id=vocabulary["<image_placeholder>"],
        initializer_range=SCALE,
    )
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.bos_token_id, generation.pad_token_id, generation.guidance_scale = 2, 0, 5
    generation.generation_kwargs = {"boi_token_id": vocabulary["<begin_of_image>"]}
    tokenizer = word_tokenizer(vocabulary, specials[4:], pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    return model, tokenizer


def tiny_emu3(codebook_size: int = 10, seed: int = 0):
    """An `Emu3ForConditionalGeneration` whose VQ model makes 2 px codes (Emu3's: 8 px) and its tokenizer."""
    specials = [
        "<pad>",
        "<unk>",
        "<bos>",
        "<eos>",
        "<|image start|>",
        "<|image token|>",
        "<|image end|>",
        "<|extra_200|>",
        "<|extra_201|>",
        "<image>",
    ]
    tokens = specials + WORDS + [f"<|visual token {c:06d}|>" for c in range(codebook_size)]
    vocabulary = {token: i for i, token in enumerate(tokens)}
    vq = {
        "codebook_size": codebook_size,
        "embed_dim": 4,
        "latent_channels": 4,
        "base_channels": 32,
        "channel_multiplier": [1, 1],
        "num_res_blocks": 1,
        "attn_resolutions": [],
        "temporal_downsample_factor": 2,
        "hidden_size": 32,
        "num_attention_heads": 1,
    }
    text = {**_text_config(len(vocabulary), bos=2, pad=0), "initializer_range": SCALE}
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocabulary)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    tokenizer = word_tokenizer(vocabulary, specials[4:], pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    return model, tokenizer


def image_token_name(code: int) -> str:
    """Chameleon's name of image code `code`: IMGIMG, its digits as letters A-J, then Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_lumina(codebook_size: int = 12, seed: int = 0):
    """A Lumina-mGPT-like `ChameleonForConditionalGeneration` and its tokenizer.

    Image codes take ids 4.. as in Chameleon, in a shuffled order; sizes up to 320 px have size tokens.
    """
    order = list(range(codebook_size))
    random.Random(seed).shuffle(order)
    tokens = ["<unk>", "<s>", "</s>", "<pad>"] + [image_token_name(c) for c in order]
    specials = ["<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>", "<image>"]
    specials += [f"<reserved{8800 + n:05d}>" for n in range(11)]
    tokens += specials + WORDS + ["Generate", "an", "image", "of", "according", "to", "following", "prompt"]
    vocabulary = {token: i for i, token in enumerate(tokens)}
    vq = {
        "embed_dim": 4,
        "num_embeddings": codebook_size,
        "latent_channels": 4,
        "base_channels": 32,
        "channel_multiplier": [1, 1],
    }
    config = ChameleonConfig(
        vocab_size=len(vocabulary),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        initializer_range=SCALE,
        vq_config=vq,
        vocabulary_map=vocabulary,
    )
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config).eval()
    tokenizer = word_tokenizer(vocabulary, specials, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    return model, tokenizer


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
