"""Tiny random instances of the published backbones' real transformers classes, with word-level tokenizers.

Each vocabulary holds the special tokens the model's own pipeline looks up by
name, so adapters meet the same names as in the real checkpoints; image codes
sit where the real vocabularies put them (Chameleon's shuffled, so a test sees
whether the vocabulary map is followed). Weights are drawn at a large scale
(0.4) so that greedy decoding depends on context and a wrong position or token
changes the codes. For the tests and for `ssd-bench quantization`, which loads
them quantized: `width` 64 (and Janus's `codebook_size` 32) makes every linear
layer's width a multiple of 32, as in the real checkpoints, so that bitsandbytes'
4-bit CPU kernels take them.
"""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    ChameleonConfig,
    ChameleonForConditionalGeneration,
    Emu3Config,
    Emu3ForConditionalGeneration,
    JanusConfig,
    JanusForConditionalGeneration,
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


def _decoder_sizes(width: int) -> dict:
    """The decoder every tiny model shares: two layers `width` wide, weights drawn at SCALE."""
    return {
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "eos_token_id": 2,
        "initializer_range": SCALE,
    }


def _text_config(vocab_size: int, bos: int, pad: int, width: int) -> dict:
    return LlamaConfig(vocab_size=vocab_size, bos_token_id=bos, pad_token_id=pad, **_decoder_sizes(width)).to_dict()


def tiny_janus(side: int = 4, codebook_size: int = 12, seed: int = 0, width: int = 32):
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
        "projection_dim": width,
        "image_token_embed_dim": width,
        "initializer_range": SCALE,
    }
    vision = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 4 * side,
        "patch_size": 4,
        "projection_dim": width,
        "num_image_tokens": side * side,
        "mlp_ratio": 2,
    }
    config = JanusConfig(
        text_config=_text_config(len(vocabulary), bos=2, pad=0, width=width),
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


def tiny_emu3(codebook_size: int = 10, seed: int = 0, width: int = 32):
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
    text = {**_text_config(len(vocabulary), bos=2, pad=0, width=width), "initializer_range": SCALE}
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocabulary)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    tokenizer = word_tokenizer(vocabulary, specials[4:], pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    return model, tokenizer


def image_token_name(code: int) -> str:
    """Chameleon's name of image code `code`: IMGIMG, its digits as letters A-J, then Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_lumina(codebook_size: int = 12, seed: int = 0, width: int = 32):
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
        bos_token_id=1,
        pad_token_id=3,
        vq_config=vq,
        vocabulary_map=vocabulary,
        **_decoder_sizes(width),
    )
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config).eval()
    tokenizer = word_tokenizer(vocabulary, specials, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    return model, tokenizer
