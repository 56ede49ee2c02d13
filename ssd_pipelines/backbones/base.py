"""The backbone contract: all a decoding strategy may ask of an autoregressive image model.

A strategy sees a grid of image codes in raster order, optionally with a forced
end-of-line token after every row, and asks the adapter five things: run tokens
through the model (appending to a KV cache it can rewind), map pre-norm hidden
states to image-codebook logits, embed codes, build the prompt batch, and turn a
grid of codes into pixels. Adapters never draft; strategies never know a model.

Whatever a model writes before its first code for a given size (Emu3's "h*w"
tokens, Lumina-mGPT's image start and size tokens) is part of the prompt batch:
`encode_prompts` is told the grid, and the batch remembers it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .runner import EAGER, EagerRunner


@dataclass(frozen=True)
class ImageGrid:
    """Geometry of the image part of the token sequence.

    The image is `rows` x `cols` codes in raster order. With `eol_token_id`, that
    token (a vocabulary id) is forced after every row, as in Emu3 and Lumina-mGPT.
    """

    rows: int
    cols: int
    codebook_size: int
    eol_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1 or self.codebook_size < 2:
            raise ValueError(f"an image grid needs rows, cols >= 1 and codebook_size >= 2, got {self}.")

    @property
    def has_eol(self) -> bool:
        return self.eol_token_id is not None

    @property
    def row_length(self) -> int:
        """Sequence positions one row takes, its end-of-line token included."""
        return self.cols + int(self.has_eol)

    @property
    def num_cells(self) -> int:
        return self.rows * self.cols

    @property
    def sequence_length(self) -> int:
        return self.rows * self.row_length


@dataclass
class PromptBatch:
    """Left-padded prompts ending just before the first image code.

    With guidance the batch holds 2B rows: the B conditional prompts first, then
    their B unconditional (or negative) counterparts, so that one forward pass
    serves both branches.
    """

    input_ids: torch.Tensor  # [B', P]
    attention_mask: torch.Tensor  # [B', P], 0 on left padding
    batch_size: int  # B: images generated
    guidance: bool
    grid: ImageGrid | None = None  # the grid these prompts ask for; None: the backbone's native grid
    notes: tuple[str, ...] = ()  # what the tokenizer changed or could not read (a cut prompt, unknown words)

    def __post_init__(self) -> None:
        expected = 2 * self.batch_size if self.guidance else self.batch_size
        if self.input_ids.shape[0] != expected:
            raise ValueError(
                f"a prompt batch of {self.batch_size} images needs {expected} rows, got {self.input_ids.shape[0]}."
            )

    @property
    def padded(self) -> bool:
        """Whether any row is padded: read where the tokenizer left the mask, on the host, before it goes to the
        model's device (where reading it would make the host wait)."""
        return not bool(self.attention_mask.all())


@dataclass
class KVState:
    """A KV cache over prompt + committed image tokens, and what positions need."""

    cache: object  # the model's cache object (a transformers `Cache` for HF models)
    prompt_mask: torch.Tensor | None  # [B', P]; None when no row is padded
    image_offset: torch.Tensor  # [B', 1] each row's position of its first image token: its prompt's length past padding
    prompt_width: int  # P
    length: int  # tokens in the cache, padding included
    image_slots: int = 0  # S: the cache's room for the image sequence past the prompt
    grid: ImageGrid | None = None  # the grid the image sequence lays out (an M-RoPE model positions its cells by it)


class ImageBackbone(ABC):
    """An autoregressive image generator as seen by the decoding strategies."""

    hidden_size: int  # width of the pre-norm hidden states
    embed_size: int  # width of the input embeddings of image codes
    default_guidance_scale: float = 3.0  # what the model's own pipeline uses when the caller names none
    # Whether the model's transformers checkpoint, as published, is a whole backbone (weights, tokenizer, its own
    # VQ decoder or none), so that `from_pretrained` can wrap it in a pipeline.
    wraps_checkpoints: bool = False

    @property
    @abstractmethod
    def grid(self) -> ImageGrid:
        """The native grid of this model."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the model's weights live; strategies put their tensors there."""

    def grid_for_size(self, height: int | None = None, width: int | None = None) -> ImageGrid:
        """The grid that makes an image of this size; raises if the model cannot make it."""
        native = self.image_size
        if (height or native[0], width or native[1]) != native:
            raise ValueError(
                f"this backbone makes {native[0]}x{native[1]} images only (a {self.grid.rows}x{self.grid.cols} "
                f"grid of codes); pass height={native[0]}, width={native[1]} or leave them unset."
            )
        return self.grid

    @property
    @abstractmethod
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels of the native grid."""

    @abstractmethod
    def encode_prompts(
        self,
        prompts: list[str],
        negative_prompts: list[str] | None = None,
        num_images_per_prompt: int = 1,
        guidance: bool = False,
        grid: ImageGrid | None = None,
    ) -> PromptBatch:
        """Tokenize prompts into a batch that ends where the first image code of `grid` (default: the native
        grid, else one from `grid_for_size`) goes."""

    @abstractmethod
    def prefill(self, prompts: PromptBatch) -> tuple[KVState, torch.Tensor]:
        """Run the prompts; return the cache and the hidden state predicting the first cell [B', d_h]."""

    @abstractmethod
    def extend(self, state: KVState, embeds: torch.Tensor) -> torch.Tensor:
        """Append input embeddings [B', n, d_e] to the cache; return their pre-norm hidden states [B', n, d_h]."""

    def extend_rows(self, state: KVState, embeds: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
        """Run input embeddings [B', n, d_e] at image positions starts[b] ... starts[b] + n - 1 of each row, each
        row attending to its own committed positions before starts[b]; return their pre-norm hidden states
        [B', n, d_h]. Rows advance at their own pace: what a row wrote beyond its next start is never seen.
        length: image slots the pass attends over, at least every row's starts[b] + n (the caller knows it without
        asking the device)."""
        raise NotImplementedError(f"{type(self).__name__} cannot advance the rows of a batch separately.")

    def extend_at(
        self,
        state: KVState,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run input embeddings [B', n, d_e] at image positions positions [B', n] (what the position encoding
        sees), writing their cache entries at image slots `slots` [B', n] (default: the positions), each token
        attending to its row's prompt and to the image slots visible [B', n, T] marks (its own slot included);
        return their pre-norm hidden states [B', n, d_h]. The general pass: tokens out of raster order (several
        image rows at once), or a tree of candidates whose branches share a position at different slots."""
        raise NotImplementedError(f"{type(self).__name__} cannot run tokens at arbitrary positions.")

    def compile_passes(self, options: dict | None) -> None:
        """Run the forward passes through `torch.compile(**options)`, or eagerly again with None (`runner`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot compile its passes.")

    @property
    def runner(self) -> EagerRunner:
        """Who runs this model's work for the engines: state, steps, and the thread a call runs on (runner.py)."""
        return EAGER

    @abstractmethod
    def memory_per_row(self, prompt_width: int, grid: ImageGrid) -> int:
        """A lower bound on the bytes one row of a prompt batch needs while it decodes `grid`: its key/value cache
        and the prefill's activations (`memory.check_batch_fits` refuses a batch that cannot fit)."""

    @abstractmethod
    def rewind(self, state: KVState, length: int) -> None:
        """Drop everything the cache holds beyond `length` tokens."""

    @abstractmethod
    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden states [..., d_h] -> image-codebook logits [..., K] (final norm + output head)."""

    @abstractmethod
    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Image codes [...] -> input embeddings [..., d_e]."""

    @abstractmethod
    def embed_token(self, token_id: int) -> torch.Tensor:
        """A vocabulary token forced into the grid (end-of-line) -> its input embedding [d_e]."""

    @property
    def can_decode(self) -> bool:
        """Whether `decode_codes` has a VQ decoder to draw with."""
        return False

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Grid of codes [B, R, C] -> images [B, 3, H, W] in [0, 1], through the model's VQ decoder."""
        raise NotImplementedError(f"{type(self).__name__} has no VQ decoder: ask for the token grid instead.")
