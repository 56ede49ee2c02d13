"""Lumina-mGPT (a Chameleon checkpoint: `transformers.ChameleonForConditionalGeneration`) as an SSD backbone.

transformers' Chameleon writes text only: its `forward` sets every image-code
logit to the minimum, and its VQ model has no decoder. So this adapter runs the
decoder itself and applies the output head to the image-code rows, and draws
with Meta's Chameleon VQGAN converted by `chameleon_vqgan.py` (the pipeline's
`vqvae`). Codes are the `IMGIMG...` tokens of Chameleon's vocabulary map.

Tokens and layout follow Lumina-mGPT's `FlexARItemProcessor` and
`FlexARInferenceSolver`: the prompt `Generate an image of {w}x{h} according to
the following prompt:\\n{prompt}` closed by `<reserved08706>` (end of turn); then
the image start `<racm3:break>` and two size tokens `<reserved{8800 + n:05d}>`,
n = height / 32 then width / 32, which Lumina-mGPT writes itself and SSD forces
here; then rows of codes, each closed by `<reserved08799>`; then `<eoss>`, not
generated here. Guidance as its CFG processor: the unconditional row is only
the image start and the size tokens (or, with a negative prompt, that prompt in
the same template), scale 4.0 as in its README. Its sampling also keeps the
2,000 most likely codes (`top_k=2000`), which callers pass themselves.
"""

from __future__ import annotations

import torch
from diffusers import VQModel
from transformers import ChameleonForConditionalGeneration, PreTrainedTokenizerBase

from ..vq import decode_codes
from .base import ImageGrid, PromptBatch
from .code_tokens import CodeTokenBackbone, CodeTokens
from .prompts import check_prompt_request, left_padded_batch


class LuminaMGPTBackbone(CodeTokenBackbone):
    """Adapter over a Lumina-mGPT `ChameleonForConditionalGeneration`, with a Chameleon VQGAN as `vqvae`."""

    PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}"
    END_OF_TURN = "<reserved08706>"
    IMAGE_START = "<racm3:break>"
    END_OF_LINE = "<reserved08799>"
    SIZE_UNIT = 32  # pixels per step of a size token: two codes of Chameleon's 16 px VQGAN
    pixels_per_code = 16
    DEFAULT_IMAGE_SIZE = (768, 768)  # Alpha-VLLM/Lumina-mGPT-7B-768
    default_guidance_scale = 4.0

    wraps_checkpoints = True

    def __init__(
        self,
        model: ChameleonForConditionalGeneration,
        tokenizer: PreTrainedTokenizerBase | None = None,
        vqvae: VQModel | None = None,
        image_size: tuple[int, int] | None = None,
    ):
        super().__init__(model.model)
        self.model = model
        self.tokenizer = tokenizer
        self.vocabulary = model.config.vocabulary_map
        missing = [
            name for name in (self.END_OF_TURN, self.IMAGE_START, self.END_OF_LINE) if name not in self.vocabulary
        ]
        if missing:
            raise ValueError(
                f"this Chameleon checkpoint's vocabulary_map lacks {', '.join(missing)}: it is not a Lumina-mGPT "
                "model; load one such as Alpha-VLLM/Lumina-mGPT-7B-768."
            )
        self.codes = CodeTokens.from_mapping(model.model.vocabulary_mapping.img2bpe)
        if vqvae is not None:
            factor = 2 ** (len(vqvae.config.block_out_channels) - 1)
            if (vqvae.config.num_vq_embeddings, factor) != (self.codes.codebook_size, self.pixels_per_code):
                raise ValueError(
                    f"the VQ decoder has {vqvae.config.num_vq_embeddings} codes of {factor} px, but Lumina-mGPT "
                    f"writes {self.codes.codebook_size} codes of {self.pixels_per_code} px: load Meta's Chameleon "
                    "VQGAN (ssd_pipelines.backbones.chameleon_vqgan.load_chameleon_vqgan)."
                )
        self.vqvae = vqvae
        self.eol_token_id = self.vocabulary[self.END_OF_LINE]
        self.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0  # masked
        self.max_positions = model.config.max_position_embeddings
        self.hidden_size = self.embed_size = model.config.hidden_size
        self.default_image_size = tuple(image_size or self.DEFAULT_IMAGE_SIZE)

    @classmethod
    def from_components(cls, model: ChameleonForConditionalGeneration, tokenizer, vqvae=None) -> LuminaMGPTBackbone:
        """The adapter over a pipeline's components; `vqvae` is the converted Chameleon VQGAN, if loaded."""
        return cls(model, tokenizer, vqvae)

    def grid_for_size(self, height: int | None = None, width: int | None = None) -> ImageGrid:
        """Sides in multiples of 32 px (the size tokens' unit) whose size tokens exist and whose image fits the
        model's positions."""
        height, width = height or self.default_image_size[0], width or self.default_image_size[1]
        unit = self.SIZE_UNIT
        if height % unit or width % unit:
            raise ValueError(
                f"Lumina-mGPT makes images whose sides are multiples of {unit} pixels, not {height}x{width}: pass "
                f"e.g. height={max(unit, round(height / unit) * unit)}, width={max(unit, round(width / unit) * unit)}."
            )
        for side in (height, width):
            if self._size_token_name(side) not in self.vocabulary:
                raise ValueError(f"Lumina-mGPT has no size token for {side} pixels: ask for a smaller image.")
        grid = self._grid_of(height, width)
        if grid.sequence_length + 1 > self.max_positions:
            raise ValueError(
                f"a {height}x{width} image takes {grid.sequence_length} tokens and this model reads at most "
                f"{self.max_positions}: ask for a smaller image (the default is {self.default_image_size})."
            )
        return grid

    def _size_token_name(self, pixels: int) -> str:
        return f"<reserved{8800 + pixels // self.SIZE_UNIT:05d}>"

    @property
    def can_decode(self) -> bool:
        return self.vqvae is not None

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if self.vqvae is None:
            return super().decode_codes(codes)
        return decode_codes(self.vqvae, codes)

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
        height, width = grid.rows * self.pixels_per_code, grid.cols * self.pixels_per_code
        image_start = [
            self.vocabulary[name] for name in (self.IMAGE_START, *map(self._size_token_name, (height, width)))
        ]
        conditional = [self._turn(p, height, width) + image_start for p in prompts]
        unconditional = None
        if guidance:
            turns = (
                [self._turn(n, height, width) for n in negative_prompts] if negative_prompts else [[]] * len(prompts)
            )
            unconditional = [turn + image_start for turn in turns]
        return left_padded_batch(conditional, unconditional, num_images_per_prompt, self.pad_token_id, grid)

    def _turn(self, prompt: str, height: int, width: int) -> list[int]:
        """BOS, the templated prompt and the end-of-turn token, as Lumina-mGPT tokenizes a human turn."""
        ids = self._text_ids(self.PROMPT_TEMPLATE.format(width=width, height=height, prompt=prompt))
        return [self.tokenizer.bos_token_id, *ids, self.vocabulary[self.END_OF_TURN]]
