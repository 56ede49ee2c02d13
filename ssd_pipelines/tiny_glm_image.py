"""A tiny random GLM-Image (`diffusers.GlmImagePipeline`) built from configs in code, for offline tests.

diffusers' own tests fetch the glyph encoder's config and the AR model's processor from the Hub; here every
component is built locally, so the stock pipeline runs, saves as a Hub snapshot is laid out and reloads with no
network. The ids follow the published vocabulary's layout: the image codes come first (0..codebook-1), then
image start and end (`<|dit_token_C|>`, `<|dit_token_C+1|>`) and a few spare ids, all inside the lm_head's
`vision_vocab_size` (as GLM-Image's 16384 codes, 16384/16385 and 126 spares fill its 16512), then the text
tokens. The AR decoder is GLM-Image's in miniature: grouped-query attention (4 heads, 2 KV heads), partial rotary
0.5 and an M-RoPE section in the published 8:12:12 ratio. Its generation config samples like the published one
but suppresses every id past the codebook (the end id too), so that a random model neither stops early nor
writes an id the DiT's prior embedding lacks; it always writes the `max_new_tokens` the pipeline asks for.
Weights are drawn at a large scale (0.4) so that greedy decoding depends on context.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    ByT5Tokenizer,
    GlmImageConfig,
    GlmImageForConditionalGeneration,
    GlmImageImageProcessor,
    GlmImageProcessor,
    PreTrainedTokenizerFast,
    T5Config,
    T5EncoderModel,
)

from ssd_pipelines.tiny_published import SCALE, WORDS

CODEBOOK_SIZE = 128
SPARE_IDS = 14  # ids past image start/end that the lm_head still covers, as GLM-Image's 126
PATCH = 16  # the vision patch: the processor's 2x downscale then makes one code per 32 px, as in GLM-Image
TEXT_SPECIALS = ["<|endoftext|>", "<unk>", "<sop>", "<eop>", "<|image|>"]


def dit_token(code: int) -> str:
    """GLM-Image's name of vision id `code`."""
    return f"<|dit_token_{code}|>"


def chat_template(codebook_size: int = CODEBOOK_SIZE) -> str:
    """The messages' content alone, as GLM-Image's AR input is the bare prompt (then the processor's grid suffix);
    each condition image is image start, its placeholder (which the processor expands to one per code), image end.
    """
    image = dit_token(codebook_size) + "<|image|>" + dit_token(codebook_size + 1)
    return (
        "{%- for message in messages -%}"
        "{%- if message.content is string -%}{{ message.content }}"
        "{%- else -%}{%- for item in message.content -%}"
        "{%- if item.type == 'image' -%}" + image + "{%- elif item.type == 'text' -%}{{ item.text }}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}"
    )


def glm_vocabulary(codebook_size: int = CODEBOOK_SIZE) -> dict[str, int]:
    """Vision ids first (codes, image start, image end, spares), then the text specials and words."""
    vision = [dit_token(code) for code in range(codebook_size + 2 + SPARE_IDS)]
    return {token: i for i, token in enumerate(vision + TEXT_SPECIALS + WORDS)}


def glm_tokenizer(codebook_size: int = CODEBOOK_SIZE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer (digits split one by one) holding the names GlmImageProcessor reads off it."""
    vocabulary = glm_vocabulary(codebook_size)
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        bos_token=dit_token(codebook_size),
        eos_token=dit_token(codebook_size + 1),
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"},
    )
    fast.add_special_tokens({"additional_special_tokens": [dit_token(c) for c in range(codebook_size + 2)]})
    return fast


def glm_processor(codebook_size: int = CODEBOOK_SIZE) -> GlmImageProcessor:
    """The AR processor with GLM-Image's image-processor settings (patch 16, no temporal patch or merge, mean and
    std 0.5) but a smaller minimum: GLM-Image's 512 x 512 would upscale tiny condition images."""
    images = GlmImageImageProcessor(
        patch_size=PATCH,
        temporal_patch_size=1,
        merge_size=1,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        min_pixels=32 * 32,
        max_pixels=256 * 256,
    )
    tokenizer = glm_tokenizer(codebook_size)
    return GlmImageProcessor(image_processor=images, tokenizer=tokenizer, chat_template=chat_template(codebook_size))


def glm_config(codebook_size: int = CODEBOOK_SIZE, width: int = 128) -> GlmImageConfig:
    """Head dim 32 at partial rotary 0.5 gives 8 rotary frequencies, split 2:3:3 (t, h, w) as GLM-Image's 8:12:12."""
    vocabulary = glm_vocabulary(codebook_size)
    text = {
        "vocab_size": len(vocabulary),
        "vision_vocab_size": codebook_size + 2 + SPARE_IDS,
        "hidden_size": width,
        "intermediate_size": width,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 3, 3],
        },
        "pad_token_id": vocabulary["<|endoftext|>"],
        "eos_token_id": codebook_size + 1,
        "initializer_range": SCALE,
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "num_heads": 2,
        "image_size": 4 * PATCH,
        "patch_size": PATCH,
        "intermediate_size": 32,
        "initializer_range": SCALE,
    }
    vq = {"embed_dim": 32, "num_embeddings": codebook_size, "latent_channels": 32, "initializer_range": SCALE}
    return GlmImageConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=vocabulary["<|image|>"],
        image_start_token_id=codebook_size,
        image_end_token_id=codebook_size + 1,
    )


def tiny_glm_ar(codebook_size: int = CODEBOOK_SIZE, seed: int = 0) -> GlmImageForConditionalGeneration:
    """The AR model, sampling as GLM-Image's generation config does, with the non-code ids suppressed."""
    config = glm_config(codebook_size)
    torch.manual_seed(seed)
    model = GlmImageForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.do_sample, generation.temperature, generation.top_p = True, 0.9, 0.75
    generation.bos_token_id = codebook_size
    generation.eos_token_id = codebook_size + 1
    generation.pad_token_id = config.text_config.pad_token_id
    generation.suppress_tokens = list(range(codebook_size, config.text_config.vision_vocab_size))
    return model


def tiny_glyph_encoder(seed: int = 0) -> tuple[T5EncoderModel, ByT5Tokenizer]:
    """A two-layer ByT5-shaped `T5EncoderModel` and the file-less `ByT5Tokenizer` (384 ids)."""
    tokenizer = ByT5Tokenizer()
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return T5EncoderModel(config).eval(), tokenizer


def tiny_dit(text_dim: int, codebook_size: int = CODEBOOK_SIZE, seed: int = 0) -> GlmImageTransformer2DModel:
    """The DiT: patch 2 over the VAE's 8x latents, so one upsampled prior code per 16 px."""
    torch.manual_seed(seed)
    return GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        text_embed_dim=text_dim,
        time_embed_dim=16,
        condition_dim=8,
        prior_vq_quantizer_codebook_size=codebook_size,
    ).eval()


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    """A four-block `AutoencoderKL` (scale factor 8) with the latent mean/std the pipeline reads."""
    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=(4, 8, 16, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=128,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()


def tiny_scheduler() -> FlowMatchEulerDiscreteScheduler:
    """Flow matching with the resolution-dependent shift `mu` that the pipeline computes (linear time shift)."""
    return FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, time_shift_type="linear", base_shift=0.25, max_shift=0.75, base_image_seq_len=256
    )


def tiny_glm_image_pipeline(seed: int = 0, codebook_size: int = CODEBOOK_SIZE) -> GlmImagePipeline:
    """Every GLM-Image component at tiny size, seeded: the same `seed` gives the same weights."""
    text_encoder, tokenizer = tiny_glyph_encoder(seed)
    return GlmImagePipeline(
        tokenizer=tokenizer,
        processor=glm_processor(codebook_size),
        text_encoder=text_encoder,
        vision_language_encoder=tiny_glm_ar(codebook_size, seed),
        vae=tiny_vae(seed),
        transformer=tiny_dit(text_encoder.config.d_model, codebook_size, seed),
        scheduler=tiny_scheduler(),
    )


def condition_tokens_patch(model: GlmImageForConditionalGeneration):
    """A `model.get_image_tokens` that takes the pipeline's concatenated condition features.

    `GlmImagePipeline.generate_prior_tokens` concatenates the per-image `(C, h, w)` features that transformers'
    `get_image_features` returns into one tensor, and `get_image_tokens` then iterates over it channel by channel,
    so image-to-image fails at any size (diffusers 0.42, transformers 5.25). This splits the tensor back into
    images of C channels (same-sized condition images only: the pipeline's concatenation rejects others).
    """
    original = model.get_image_tokens
    channels = model.config.vq_config.latent_channels

    def get_image_tokens(hidden_states, image_grid_thw=None):
        if torch.is_tensor(hidden_states):
            hidden_states = hidden_states.split(channels)
        return original(hidden_states, image_grid_thw)

    return get_image_tokens


def save_tiny_glm_image(folder: str | Path, seed: int = 0) -> Path:
    """Writes the tiny pipeline to `folder` in a Hub snapshot's layout (model_index.json and one folder a component)."""
    folder = Path(folder)
    tiny_glm_image_pipeline(seed).save_pretrained(folder)
    return folder
