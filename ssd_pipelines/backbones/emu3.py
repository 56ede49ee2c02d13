"""Emu3 (`transformers.Emu3ForConditionalGeneration`, e.g. BAAI/Emu3-Gen-hf) as an SSD backbone.

Emu3 writes image codes as tokens of its text vocabulary (`<|visual token 000123|>`
in its `vocabulary_map`), row after row, each row closed by the end-of-line
token `<|extra_200|>`; end-of-frame, end-of-image and EOS follow the last row
and are not generated here (decoding stops at the last code). The prompt is the
one `Emu3Processor(..., return_for_image_generation=True)` builds:
`<bos> prompt <|image start|>{rows}*{cols}<|image token|>`. Any image whose sides
are multiples of the VQ model's 8 px works; the default is the processor's
720 x 720 (90 x 90 codes). Guidance follows BAAI's generation script: the
negative prompt (empty by default) in the same template, scale 3.0; transformers
runs that branch unbatched, the strategies here batch it with the conditional one.
"""

from __future__ import annotations

import torch
from transformers import Emu3ForConditionalGeneration, PreTrainedTokenizerBase

from .base import ImageGrid, PromptBatch
from .causal_lm import execution_device
from .code_tokens import CodeTokenBackbone, CodeTokens
from .prompts import check_prompt_request, left_padded_batch


class Emu3Backbone(CodeTokenBackbone):
    """Adapter over `Emu3ForConditionalGeneration`; `image_size` is the (height, width) made by default."""

    IMAGE_START = "<|image start|>"
    IMAGE_WRAPPER = "<|image token|>"  # closes the "rows*cols" size prefix
    DEFAULT_IMAGE_SIZE = (720, 720)  # Emu3Processor: image_area 518400 at ratio 1:1
    TRAILING_TOKENS = 3  # end-of-frame, end-of-image, EOS after the last row
    default_guidance_scale = 3.0

    wraps_checkpoints = True

    def __init__(
        self,
        model: Emu3ForConditionalGeneration,
        tokenizer: PreTrainedTokenizerBase | None = None,
        image_size: tuple[int, int] | None = None,
    ):
        super().__init__(model.model.text_model)
        self.model = model
        self.tokenizer = tokenizer
        vocabulary, mapping = model.config.vocabulary_map, model.vocabulary_mapping
        missing = [name for name in (self.IMAGE_START, self.IMAGE_WRAPPER, "<|extra_200|>") if name not in vocabulary]
        if missing:
            raise ValueError(
                f"this Emu3 checkpoint's vocabulary_map lacks {', '.join(missing)}, which image generation needs: "
                "load an image-generation checkpoint such as BAAI/Emu3-Gen-hf."
            )
        self.codes = CodeTokens.from_mapping(mapping.img2bpe)
        if model.config.vq_config.codebook_size != self.codes.codebook_size:
            raise ValueError(
                f"Emu3's VQ model has {model.config.vq_config.codebook_size} codes but its vocabulary "
                f"{self.codes.codebook_size} visual tokens: the checkpoint's config.json is inconsistent."
            )
        self.image_start_token_id = vocabulary[self.IMAGE_START]
        self.image_wrapper_token_id = vocabulary[self.IMAGE_WRAPPER]
        self.eol_token_id = mapping.eol_token_id
        text = model.config.text_config
        self.pad_token_id = text.pad_token_id if text.pad_token_id is not None else 0  # masked: any id serves
        self.config_bos_token_id = text.bos_token_id
        self.max_positions = text.max_position_embeddings
        self.pixels_per_code = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
        self.hidden_size = self.embed_size = text.hidden_size
        self.default_image_size = tuple(image_size or self.DEFAULT_IMAGE_SIZE)

    @classmethod
    def from_components(cls, model: Emu3ForConditionalGeneration, tokenizer, vqvae=None) -> Emu3Backbone:
        """The adapter over a pipeline's components; Emu3 decodes with its own VQ model, so `vqvae` is None."""
        if vqvae is not None:
            raise ValueError("Emu3 decodes with the VQ model inside its checkpoint: load the pipeline without vqvae.")
        return cls(model, tokenizer)

    def grid_for_size(self, height: int | None = None, width: int | None = None) -> ImageGrid:
        """Emu3 makes any size whose sides are multiples of its VQ model's code size, while the image fits its
        positions."""
        height, width = height or self.default_image_size[0], width or self.default_image_size[1]
        f = self.pixels_per_code
        if height % f or width % f:
            raise ValueError(
                f"Emu3 makes images whose sides are multiples of {f} pixels, not {height}x{width}: pass e.g. "
                f"height={max(f, round(height / f) * f)}, width={max(f, round(width / f) * f)}."
            )
        grid = self._grid_of(height, width)
        if grid.sequence_length + self.TRAILING_TOKENS > self.max_positions:
            raise ValueError(
                f"a {height}x{width} image takes {grid.sequence_length} tokens and Emu3 reads at most "
                f"{self.max_positions}: ask for a smaller image (the default is {self.default_image_size})."
            )
        return grid

    @property
    def can_decode(self) -> bool:
        return True

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        vq = self.model.model.vqmodel
        pixels = vq.decode(codes.to(execution_device(vq)))  # [B, 3, H, W] in [-1, 1]
        return ((pixels.float() + 1) / 2).clamp(0, 1)

    def encode_prompts(
        self,
        prompts: list[str],
        negative_prompts: list[str] | None = None,
        num_images_per_prompt: int = 1,
        guidance: bool = False,
        grid: ImageGrid | None = None,
    ) -> PromptBatch:
        check_prompt_request(prompts, negative_prompts, num_images_per_prompt, guidance)
        grid = grid or self.grid
        size = [self.image_start_token_id, *self._text_ids(f"{grid.rows}*{grid.cols}"), self.image_wrapper_token_id]
        bos = self.tokenizer.bos_token_id  # what Emu3Processor prepends
        bos = self.config_bos_token_id if bos is None else bos
        conditional = [[bos, *self._text_ids(p), *size] for p in prompts]
        unconditional = None
        if guidance:
            unconditional = [[bos, *self._text_ids(n), *size] for n in negative_prompts or [""] * len(prompts)]
        return left_padded_batch(conditional, unconditional, num_images_per_prompt, self.pad_token_id, grid)
