"""Image codes that are tokens of a text vocabulary (Emu3, Chameleon / Lumina-mGPT): their ids and output rows.

Both models keep a vocabulary map from code to token id (`img2bpe`). The logits
of the codes are the output head's rows for those ids; when the ids form one
run in code order, as in both published checkpoints, the rows are a view of the
head's weight instead of a copy made at every step. `CodeTokenBackbone` is what
the two adapters share on top of that: rows of such codes, each closed by an
end-of-line token, embedded and read out through the text model's own tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import ImageGrid
from .causal_lm import CausalLMBackbone, execution_device


class CodeTokens:
    """The vocabulary id of every image code. `token_ids[c]` is the id of code c."""

    def __init__(self, token_ids: torch.Tensor):
        self.token_ids = token_ids.long()  # [K]
        start, size = int(self.token_ids[0]), len(self.token_ids)
        contiguous = torch.equal(self.token_ids, torch.arange(start, start + size))
        self._run = slice(start, start + size) if contiguous else None

    @classmethod
    def from_mapping(cls, img2bpe: dict[int, int]) -> CodeTokens:
        """From a model's code -> token id map, which must cover codes 0..K-1."""
        size = len(img2bpe)
        if sorted(img2bpe) != list(range(size)):
            raise ValueError(
                f"the model's vocabulary map does not give a token to each image code 0..{size - 1}: "
                "its config.json vocabulary_map is damaged; re-download the model."
            )
        return cls(torch.tensor([img2bpe[c] for c in range(size)]))

    @property
    def codebook_size(self) -> int:
        return len(self.token_ids)

    def ids(self, codes: torch.Tensor) -> torch.Tensor:
        """Image codes [...] -> vocabulary ids [...]."""
        return self._on(codes.device)[codes]

    def logits(self, normed: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
        """Normed hidden states [..., d] and the output head's weight [V, d] -> code logits [..., K]."""
        if self._run is not None:
            rows = head_weight[self._run]  # a view
        else:
            rows = head_weight.index_select(0, self._on(head_weight.device))
        return F.linear(normed, rows)

    def _on(self, device: torch.device) -> torch.Tensor:
        """The ids on `device`, moved there once rather than at every pass."""
        if self.token_ids.device != device:
            self.token_ids = self.token_ids.to(device)
        return self.token_ids


class CodeTokenBackbone(CausalLMBackbone):
    """An adapter whose codes are vocabulary tokens (`codes`), on a grid of `pixels_per_code` px codes whose rows end
    in `eol_token_id`; the model's `lm_head` reads them out and its decoder's token table embeds them."""

    codes: CodeTokens
    pixels_per_code: int
    eol_token_id: int
    default_image_size: tuple[int, int]

    @property
    def grid(self) -> ImageGrid:
        """The default size's grid (what `grid_for_size()` returns, without its check that the image fits)."""
        height, width = self.default_image_size
        return self._grid_of(height, width)

    @property
    def image_size(self) -> tuple[int, int]:
        return self.default_image_size

    def _grid_of(self, height: int, width: int) -> ImageGrid:
        f = self.pixels_per_code
        return ImageGrid(height // f, width // f, self.codes.codebook_size, self.eol_token_id)

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codes.logits(self.final_norm(hidden), self.model.lm_head.weight)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(self.codes.ids(codes))

    def embed_token(self, token_id: int) -> torch.Tensor:
        # the index is filled on the device: torch.tensor(token_id, device=...) would copy from pageable host memory,
        # which blocks the host on a GPU, and the frontier embeds the end-of-line token every pass
        embedding = self.decoder.embed_tokens
        return embedding(torch.full((), token_id, dtype=torch.long, device=execution_device(embedding)))

    def _text_ids(self, text: str) -> list[int]:
        """The tokenizer's ids of `text`, without the special tokens it would add (the prompt places its own)."""
        if self.tokenizer is None:
            raise ValueError("this backbone was built without a tokenizer: pass one to encode text prompts.")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
