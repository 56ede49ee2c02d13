"""A plain `transformers.LlamaForCausalLM` that writes an image as a fixed grid of codes after a text prompt.

Sequence: [BOS, prompt tokens, BOI, row 0 codes (EOL), row 1 codes (EOL), ..., EOI].
Image code c is vocabulary id `code_offset + c`. The grid geometry lives in the
model's own `config.json` under `image_grid`, so a saved model is self-describing.
Guidance follows Janus: the unconditional prompt keeps BOS and BOI and replaces
every prompt token by the pad token.

This is the test backbone of the library and the base of our reference model.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from ..vq import decode_codes
from .base import ImageGrid, PromptBatch
from .causal_lm import CausalLMBackbone
from .prompts import check_prompt_request, left_padded_batch, shortened


@dataclass(frozen=True)
class GridTokens:
    """Where the image lives in a Llama vocabulary; stored as `config.image_grid`."""

    rows: int
    cols: int
    codebook_size: int
    code_offset: int  # vocabulary id of image code 0
    boi_token_id: int
    eoi_token_id: int
    eol_token_id: int | None = None
    pixels_per_code: int = 4  # the VQ decoder's downsampling factor

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, config) -> GridTokens:
        """The grid a Llama config's `image_grid` describes, or a ValueError naming the key at fault."""
        grid = getattr(config, "image_grid", None)
        if grid is None:
            raise ValueError(
                "this Llama model has no `image_grid` in its config.json: it was not trained to write images. "
                "Load an SSD image backbone (its config.json names rows, cols, codebook_size and the special tokens)."
            )
        if not isinstance(grid, dict):
            raise ValueError(  # noqa: TRY004 (the file's fault, not the caller's type)
                f"`image_grid` in the backbone's config.json must be an object, got {grid!r}."
            )
        declared = {f.name: f for f in fields(cls)}
        missing = [name for name, f in declared.items() if f.default is MISSING and name not in grid]
        unknown = sorted(set(grid) - set(declared))
        if missing or unknown:
            raise ValueError(
                f"`image_grid` in the backbone's config.json must hold {', '.join(declared)}: "
                + (f"{', '.join(missing)} missing" if missing else f"{', '.join(unknown)} unknown")
                + "."
            )
        for name, value in grid.items():
            least = 0 if name.endswith(("_id", "_offset")) else 1
            optional = declared[name].default is None
            if not (value is None and optional) and (
                isinstance(value, bool) or not isinstance(value, int) or value < least
            ):
                raise ValueError(
                    f"`image_grid.{name}` in the backbone's config.json must be an integer >= {least}"
                    f"{' or null' if optional else ''}, got {value!r}."
                )
        return cls(**grid)


class LlamaGridBackbone(CausalLMBackbone):
    """Adapter over a `LlamaForCausalLM` whose `config.image_grid` describes a fixed code grid."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: PreTrainedTokenizerBase | None = None,
        decode_codes: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        super().__init__(model.model)
        config = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.tokens = GridTokens.from_config(config)
        self._decode_codes = decode_codes
        self.hidden_size = self.embed_size = config.hidden_size
        self._grid = ImageGrid(self.tokens.rows, self.tokens.cols, self.tokens.codebook_size, self.tokens.eol_token_id)
        self._check_vocabulary(config.vocab_size)

    @classmethod
    def from_components(cls, model: LlamaForCausalLM, tokenizer, vqvae=None) -> LlamaGridBackbone:
        """The adapter over a pipeline's components; `vqvae` is a diffusers `VQModel` over the same codebook."""
        codebook_size = GridTokens.from_config(model.config).codebook_size
        if vqvae is not None and vqvae.config.num_vq_embeddings != codebook_size:
            raise ValueError(
                f"the VQ decoder has {vqvae.config.num_vq_embeddings} codes but the backbone writes "
                f"{codebook_size}: load the VQ model trained with this backbone."
            )
        return cls(model, tokenizer, None if vqvae is None else partial(decode_codes, vqvae))

    def _check_vocabulary(self, vocab_size: int) -> None:
        t = self.tokens
        codes = range(t.code_offset, t.code_offset + t.codebook_size)
        if codes.stop > vocab_size:
            raise ValueError(
                f"image codes {codes.start}..{codes.stop - 1} do not fit a vocabulary of {vocab_size} tokens."
            )
        for name in ("boi_token_id", "eoi_token_id", "eol_token_id"):
            token = getattr(t, name)
            if token is not None and (token in codes or not 0 <= token < vocab_size):
                raise ValueError(
                    f"{name}={token} must be a vocabulary id outside the image codes {codes.start}..{codes.stop - 1}."
                )

    @property
    def grid(self) -> ImageGrid:
        return self._grid

    @property
    def image_size(self) -> tuple[int, int]:
        return self.tokens.rows * self.tokens.pixels_per_code, self.tokens.cols * self.tokens.pixels_per_code

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        start = self.tokens.code_offset
        weight = self.model.lm_head.weight[start : start + self.tokens.codebook_size]
        return F.linear(self.final_norm(hidden), weight)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(codes + self.tokens.code_offset)

    def embed_token(self, token_id: int) -> torch.Tensor:
        return self.decoder.embed_tokens.weight[token_id]

    @property
    def can_decode(self) -> bool:
        return self._decode_codes is not None

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if self._decode_codes is None:
            return super().decode_codes(codes)
        return self._decode_codes(codes)

    @property
    def max_prompt_tokens(self) -> int:
        """Prompt tokens this model reads: what its tokenizer was made for, and what its positions leave beside
        BOS, BOI and the image."""
        positions = self.model.config.max_position_embeddings - self.grid.sequence_length - 2
        return max(0, min(positions, self.tokenizer.model_max_length - 2))

    def prompt_token_ids(self, prompt: str, notes: list[str] | None = None) -> list[int]:
        """Token ids of a prompt, cut to `max_prompt_tokens`. When it is cut or holds words the tokenizer does not
        know (read as its unknown token: nothing the model can draw), says so in `notes` (which the pipeline hands
        to its caller) and as a warning."""
        if self.tokenizer is None:
            raise ValueError("this backbone was built without a tokenizer: pass one to encode text prompts.")
        fast = self.tokenizer.is_fast  # only a fast tokenizer tells which characters each token came from
        encoded = self.tokenizer(prompt, add_special_tokens=False, verbose=False, return_offsets_mapping=fast)
        ids = encoded["input_ids"]
        said = []
        unknown = [k for k, i in enumerate(ids) if i == self.tokenizer.unk_token_id]
        if unknown:
            words = (
                f": {', '.join(repr(prompt[slice(*encoded['offset_mapping'][k])]) for k in unknown)}" if fast else ""
            )
            barely = ", so the image will barely follow it" if 2 * len(unknown) > len(ids) else ""
            said.append(
                f"{len(unknown)} of the {len(ids)} words of the prompt {shortened(prompt)!r} are unknown to this "
                f"model's tokenizer and were dropped{words}{barely}. Use words the model was trained on."
            )
        if len(ids) > self.max_prompt_tokens:
            said.append(
                f"the prompt {shortened(prompt)!r} has {len(ids)} tokens and this model reads at most "
                f"{self.max_prompt_tokens}: only the first {self.max_prompt_tokens} were used. Shorten the prompt."
            )
            ids = ids[: self.max_prompt_tokens]
        for note in said:
            warnings.warn(note, stacklevel=2)
        if notes is not None:
            notes.extend(said)
        return ids

    def encode_prompts(
        self,
        prompts: list[str],
        negative_prompts: list[str] | None = None,
        num_images_per_prompt: int = 1,
        guidance: bool = False,
        grid: ImageGrid | None = None,
    ) -> PromptBatch:
        check_prompt_request(prompts, negative_prompts, num_images_per_prompt, guidance)
        bos, pad, boi = self.model.config.bos_token_id, self._pad_token_id, self.tokens.boi_token_id
        notes: list[str] = []
        cond = [self.prompt_token_ids(p, notes) for p in prompts]
        uncond = None
        if guidance:
            uncond = (
                [self.prompt_token_ids(n, notes) for n in negative_prompts]
                if negative_prompts
                else [[pad] * len(i) for i in cond]
            )
        rows = [[bos, *ids, boi] for ids in cond]
        uncond_rows = None if uncond is None else [[bos, *ids, boi] for ids in uncond]
        batch = left_padded_batch(rows, uncond_rows, num_images_per_prompt, pad, grid)
        batch.notes = tuple(dict.fromkeys(notes))  # a prompt repeated in the batch is said once
        return batch

    @property
    def _pad_token_id(self) -> int:
        pad = self.model.config.pad_token_id
        if pad is None:
            raise ValueError("the backbone's config has no pad_token_id; guidance and batching need one.")
        return pad
