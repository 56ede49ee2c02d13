"""Image codes that are tokens of a text vocabulary (Emu3, Chameleon / Lumina-mGPT): their ids and output rows.

Both models keep a vocabulary map from code to token id (`img2bpe`). The logits
of the codes are the output head's rows for those ids; when the ids form one
run in code order, as in both published checkpoints, the rows are a view of the
head's weight instead of a copy made at every step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
