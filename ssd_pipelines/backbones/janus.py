"""Janus-Pro (`transformers.JanusForConditionalGeneration`) as an SSD backbone.

Janus generates an image with separate image weights around its Llama decoder:
a code's logits come from the generation head applied to the normed hidden
state (not `lm_head`), and a chosen code re-enters the decoder through the
generation embedding and its aligner. The grid is fixed: `vq_config.num_patches`
codes a side (24 x 24 at 384 px), no end-of-line token. Prompts follow
deepseek's generation script: `<|User|>: {prompt}\\n\\n<|Assistant|>:` between BOS
and `<begin_of_image>`. Guidance follows `JanusForConditionalGeneration.generate`:
the unconditional row is the same prompt with every token but BOS and
begin-of-image replaced by the pad token, and the default scale is the
checkpoint's `generation_config.guidance_scale` (5 in deepseek's).
"""

from __future__ import annotations

import torch
from transformers import JanusForConditionalGeneration, PreTrainedTokenizerBase

from .base import ImageGrid, PromptBatch
from .causal_lm import CausalLMBackbone, execution_device
from .prompts import check_prompt_request, left_padded_batch


class JanusProBackbone(CausalLMBackbone):
    """Adapter over `JanusForConditionalGeneration` (Janus-Pro-1B / -7B in transformers format)."""

    PROMPT_TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"
    BEGIN_OF_IMAGE = "<begin_of_image>"

    wraps_checkpoints = True

    def __init__(self, model: JanusForConditionalGeneration, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__(model.model.language_model)
        self.model = model
        self.tokenizer = tokenizer
        generation = model.generation_config
        self.bos_token_id = generation.bos_token_id
        self.pad_token_id = generation.pad_token_id
        self.boi_token_id = self._begin_of_image_id(model, tokenizer)
        if None in (self.bos_token_id, self.pad_token_id, self.boi_token_id):
            raise ValueError(
                "this Janus checkpoint does not name its bos, pad and begin-of-image tokens (generation_config.json "
                "and tokenizer), which image generation needs: load a transformers-format Janus-Pro checkpoint "
                "such as deepseek-community/Janus-Pro-7B."
            )
        self.default_guidance_scale = float(generation.guidance_scale or 5.0)
        vq = model.config.vq_config
        side = vq.num_patches
        if side * side != model.config.vision_config.num_image_tokens:
            raise ValueError(
                f"this Janus config writes {model.config.vision_config.num_image_tokens} image tokens, not a "
                f"{side} x {side} grid of its VQ model: its config.json is inconsistent; re-download it."
            )
        self._grid = ImageGrid(side, side, vq.num_embeddings)
        self.pixels_per_code = 2 ** (len(vq.channel_multiplier) - 1)  # 16 for Janus-Pro's VQ-16
        self.hidden_size = self.embed_size = model.config.text_config.hidden_size

    @classmethod
    def _begin_of_image_id(cls, model: JanusForConditionalGeneration, tokenizer) -> int | None:
        """`generation_kwargs.boi_token_id`, which `generate` reads; transformers drops it when loading a
        generation_config.json marked `_from_model_config`, and then the tokenizer's `<begin_of_image>` is it."""
        boi = (getattr(model.generation_config, "generation_kwargs", None) or {}).get("boi_token_id")
        if boi is None and tokenizer is not None:
            found = tokenizer.convert_tokens_to_ids(cls.BEGIN_OF_IMAGE)
            boi = found if found != tokenizer.unk_token_id else None
        return boi

    @classmethod
    def from_components(cls, model: JanusForConditionalGeneration, tokenizer, vqvae=None) -> JanusProBackbone:
        """The adapter over a pipeline's components; Janus decodes with its own VQ model, so `vqvae` is None."""
        if vqvae is not None:
            raise ValueError(
                "Janus-Pro decodes with the VQ model inside its checkpoint: load the pipeline without vqvae."
            )
        return cls(model, tokenizer)

    @property
    def grid(self) -> ImageGrid:
        return self._grid

    @property
    def image_size(self) -> tuple[int, int]:
        side = self._grid.rows * self.pixels_per_code
        return side, side

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(self.final_norm(hidden))

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(codes)

    def embed_token(self, token_id: int) -> torch.Tensor:
        raise ValueError("Janus-Pro's grid has no end-of-line token: no token is forced between its codes.")

    @property
    def can_decode(self) -> bool:
        return True

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        vq = self.model.model.vqmodel
        pixels = self.model.decode_image_tokens(codes.flatten(1).to(execution_device(vq)))  # [B, H, W, 3] in [-1, 1]
        return ((pixels.permute(0, 3, 1, 2).float() + 1) / 2).clamp(0, 1)

    def encode_prompts(
        self,
        prompts: list[str],
        negative_prompts: list[str] | None = None,
        num_images_per_prompt: int = 1,
        guidance: bool = False,
        grid: ImageGrid | None = None,
    ) -> PromptBatch:
        check_prompt_request(prompts, negative_prompts, num_images_per_prompt, guidance)
        text = [self._text_ids(p) for p in prompts]
        conditional = [[self.bos_token_id, *ids, self.boi_token_id] for ids in text]
        unconditional = None
        if guidance:
            masked = (
                [self._text_ids(n) for n in negative_prompts]
                if negative_prompts
                else [[self.pad_token_id] * len(i) for i in text]
            )
            unconditional = [[self.bos_token_id, *ids, self.boi_token_id] for ids in masked]
        return left_padded_batch(conditional, unconditional, num_images_per_prompt, self.pad_token_id, grid)

    def _text_ids(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this backbone was built without a tokenizer: pass one to encode text prompts.")
        return self.tokenizer(self.PROMPT_TEMPLATE.format(prompt=prompt.strip()), add_special_tokens=False)["input_ids"]
