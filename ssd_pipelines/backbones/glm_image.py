"""GLM-Image's autoregressive stage (`transformers.GlmImageForConditionalGeneration`, zai-org/GLM-Image) as an SSD
backbone.

GLM-Image writes its prior tokens in two grids, one code a token: for text to image a preview grid of about 16 x 16
codes, then the large grid of one code per 32 px (32 x 32 at 1024 x 1024), then its end token; a DiT renders the
large grid (`SSDGlmImagePipeline`). The sizes follow `GlmImageProcessor._get_target_shape`. The prompt is what the
processor's chat template makes of it, ending with the grids' sizes and the image-start token; its lm_head scores
16,512 vision ids, of which the first `vq_config.num_embeddings` are the codes, and a code re-enters the decoder as
that id of its text embedding.

Positions are 3D (M-RoPE): a code of a grid at (row, col) sits at (t, h, w) = (b, b + row, b + col), where b is the
position after the prompt, and each grid moves b on by its longer side. transformers keeps these positions on the
model between calls (`rope_deltas`, `_cached_decode_position_ids`); here they are computed from each cell's grid
position, so one loaded model serves any number of threads and calls. Each grid is one decoding: the large grid's
prompt is the preview's prompt followed by the preview's codes (`after_preview`), run again by the prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

from .base import ImageGrid, KVState, PromptBatch
from .causal_lm import CausalLMBackbone
from .prompts import check_prompt_request, left_padded_batch

FACTOR = 32  # pixels a large-grid code covers, as GlmImageProcessor._get_target_shape counts


def target_grids(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, cols) of the large grid and of the preview grid for an image of this size, as
    `GlmImageProcessor._get_target_shape` computes them: one large code per 32 px, and a preview of about 16 x 16
    codes in the image's aspect ratio."""
    rows, cols = height // FACTOR, width // FACTOR
    ratio = rows / cols
    return (rows, cols), (int(math.sqrt(ratio) * (FACTOR // 2)), int(math.sqrt(1 / ratio) * (FACTOR // 2)))


@dataclass
class GlmImagePromptBatch(PromptBatch):
    """A prompt batch of GLM-Image: for text to image the preview's prompt (`grid` the preview grid, `large` the grid
    after it), or the large grid's, whose prompt ends with the preview's codes (`preview`)."""

    large: ImageGrid | None = None
    preview: ImageGrid | None = None

    @classmethod
    def of(cls, batch: PromptBatch, large: ImageGrid, preview: ImageGrid | None = None) -> GlmImagePromptBatch:
        return cls(**{f.name: getattr(batch, f.name) for f in fields(PromptBatch)}, large=large, preview=preview)


class GlmImageBackbone(CausalLMBackbone):
    """Adapter over `GlmImageForConditionalGeneration`; `image_size` is the (height, width) made by default."""

    DEFAULT_IMAGE_SIZE = (1024, 1024)
    default_guidance_scale = 1.0  # the stock pipeline samples the AR stage without guidance (the DiT has its own)

    def __init__(
        self,
        model: GlmImageForConditionalGeneration,
        processor: GlmImageProcessor | None = None,
        image_size: tuple[int, int] | None = None,
    ):
        super().__init__(model.model.language_model)
        self.model, self.processor = model, processor
        self.tokenizer = None if processor is None else processor.tokenizer
        config = model.config
        self.codebook_size = config.vq_config.num_embeddings
        vision_ids = config.text_config.vision_vocab_size
        if not self.codebook_size < vision_ids <= model.lm_head.out_features:
            raise ValueError(
                f"this GLM-Image config has {self.codebook_size} codes and {vision_ids} vision ids for an lm_head of "
                f"{model.lm_head.out_features}: its config.json is inconsistent; re-download it."
            )
        self.hidden_size = self.embed_size = config.text_config.hidden_size
        self._image_size = image_size or self.DEFAULT_IMAGE_SIZE
        self._preview, self._grid = self.grids_for_size(*self._image_size)

    @classmethod
    def from_components(cls, model: GlmImageForConditionalGeneration, processor, vqvae=None) -> GlmImageBackbone:
        """The adapter over a pipeline's components: the AR model and its processor. Its images come from
        GLM-Image's DiT (`SSDGlmImagePipeline`), so `vqvae` is None."""
        if vqvae is not None:
            raise ValueError("GLM-Image's codes are rendered by its DiT, not a VQ decoder: load it without vqvae.")
        return cls(model, processor)

    def grids_for_size(self, height: int, width: int) -> tuple[ImageGrid, ImageGrid]:
        """(preview grid, large grid) of an image of this size; raises if the processor cannot make it."""
        if height < FACTOR or width < FACTOR or height % FACTOR or width % FACTOR:
            raise ValueError(
                f"GLM-Image makes images whose sides are multiples of {FACTOR} px (one code each), got "
                f"{height}x{width}: pass height and width that are, e.g. {max(FACTOR, height // FACTOR * FACTOR)}x"
                f"{max(FACTOR, width // FACTOR * FACTOR)}."
            )
        large, preview = target_grids(height, width)
        return ImageGrid(*preview, self.codebook_size), ImageGrid(*large, self.codebook_size)

    @property
    def grid(self) -> ImageGrid:
        return self._grid

    @property
    def image_size(self) -> tuple[int, int]:
        return self._image_size

    def grid_for_size(self, height: int | None = None, width: int | None = None) -> ImageGrid:
        """The large grid; any size whose sides are multiples of 32 px works."""
        return self.grids_for_size(height or self._image_size[0], width or self._image_size[1])[1]

    def encode_prompts(
        self,
        prompts: list[str],
        negative_prompts: list[str] | None = None,
        num_images_per_prompt: int = 1,
        guidance: bool = False,
        grid: ImageGrid | None = None,
    ) -> GlmImagePromptBatch:
        """The preview grid's prompts for the large grid `grid` (default: the native size's), as the stock pipeline's
        processor writes them: the chat template, the two grids' sizes, the image-start token."""
        check_prompt_request(prompts, negative_prompts, num_images_per_prompt, guidance)
        large = grid or self._grid
        height, width = large.rows * FACTOR, large.cols * FACTOR
        preview = self.grids_for_size(height, width)[0]
        conditional = [self._prompt_ids(p, height, width) for p in prompts]
        unconditional = None
        if guidance:
            negatives = negative_prompts or [""] * len(prompts)
            unconditional = [self._prompt_ids(n, height, width) for n in negatives]
        pad = self.model.config.text_config.pad_token_id
        batch = left_padded_batch(conditional, unconditional, num_images_per_prompt, pad, preview)
        return GlmImagePromptBatch.of(batch, large)

    def after_preview(self, batch: GlmImagePromptBatch, codes: torch.Tensor) -> GlmImagePromptBatch:
        """The large grid's prompts: each preview prompt followed by its image's preview codes [B, R, C]."""
        if batch.preview is not None:
            raise ValueError("this prompt batch is the large grid's already: its preview codes are in it.")
        rows = codes.flatten(1).to(batch.input_ids)
        if batch.guidance:  # both branches read the image's codes
            rows = torch.cat([rows, rows])
        ids = torch.cat([batch.input_ids, rows], dim=1)
        mask = torch.cat([batch.attention_mask, torch.ones_like(rows)], dim=1)
        large = PromptBatch(ids, mask, batch.batch_size, batch.guidance, batch.large, batch.notes)
        return GlmImagePromptBatch.of(large, batch.large, preview=batch.grid)

    def _prompt_ids(self, prompt: str, height: int, width: int) -> list[int]:
        if self.processor is None:
            raise ValueError("this backbone was built without a processor: pass one to encode text prompts.")
        messages = [[{"role": "user", "content": [{"type": "text", "text": prompt.strip()}]}]]
        size = {"target_h": height, "target_w": width}
        inputs = self.processor.apply_chat_template(
            messages, tokenize=True, processor_kwargs=size, return_dict=True, return_tensors="pt"
        )
        return inputs["input_ids"][0].tolist()

    def prompt_positions(self, prompts: PromptBatch, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Text tokens at (j, j, j); the preview codes ending a large grid's prompt at their 3D positions; the image
        after them one preview side further on, as `GlmImageModel.get_rope_index` lays them out."""
        index = (mask.cumsum(dim=1) - 1).clamp_min(0)  # [B', P]
        length = mask.sum(dim=1, keepdim=True)  # [B', 1]
        preview = getattr(prompts, "preview", None)
        if preview is None:
            return index, length
        text = length - preview.num_cells  # the preview's base: past the text and image start
        cell = index - text
        on_preview = cell >= 0
        rows = torch.where(on_preview, text + cell // preview.cols, index)
        cols = torch.where(on_preview, text + cell % preview.cols, index)
        base = torch.where(on_preview, text, index)
        return torch.stack([base, rows, cols]), text + max(preview.rows, preview.cols)

    def image_positions(self, state: KVState, positions: torch.Tensor) -> torch.Tensor:
        """Image positions [B', n] or [n] -> (t, h, w) position ids [3, B', n] from each cell's row and column."""
        cols = state.grid.cols
        base = state.image_offset.expand(-1, positions.shape[-1])  # [B', n]
        return torch.stack([base, base + positions // cols, base + positions % cols])

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head's rows of the codes alone: image start, end and the spare ids are never drawn."""
        return F.linear(self.final_norm(hidden), self.model.lm_head.weight[: self.codebook_size])

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(codes)  # a code's vision id is its text id

    def embed_token(self, token_id: int) -> torch.Tensor:
        raise ValueError("GLM-Image's grids have no end-of-line token: no token is forced between its codes.")
