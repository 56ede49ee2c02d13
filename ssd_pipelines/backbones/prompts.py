"""Prompt batches as every adapter builds them: the request checked, rows repeated per image, left padding.

Adapters differ only in the token ids of one conditional and one unconditional
row per prompt (their templates and guidance conventions); the batch layout
the strategies rely on (conditional rows first, then their unconditional
twins, left-padded) is made here once.
"""

from __future__ import annotations

import weakref

import torch

from .base import ImageGrid, PromptBatch


def check_prompt_request(
    prompts: list[str], negative_prompts: list[str] | None, num_images_per_prompt: int, guidance: bool
) -> None:
    """Raise a `ValueError` saying what to change if the request cannot make a batch."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings: pass at least one prompt.")
    if num_images_per_prompt < 1:
        raise ValueError(f"num_images_per_prompt must be >= 1, got {num_images_per_prompt}.")
    if negative_prompts is not None and len(negative_prompts) != len(prompts):
        raise ValueError(
            f"got {len(negative_prompts)} negative prompts for {len(prompts)} prompts: pass one per prompt."
        )
    if negative_prompts is not None and not guidance:
        raise ValueError("a negative prompt only acts through guidance: set guidance_scale > 1 or drop it.")


_LONGEST_TOKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its longest entry, in chars


def longest_token_chars(tokenizer) -> int:
    """Characters of the tokenizer's longest vocabulary entry, read once per tokenizer (a vocabulary of 150,000
    entries takes milliseconds, and adapters are built per call)."""
    if tokenizer not in _LONGEST_TOKEN:
        _LONGEST_TOKEN[tokenizer] = max(map(len, tokenizer.get_vocab()), default=1)
    return _LONGEST_TOKEN[tokenizer]


def readable_chars(max_tokens: int, tokenizer) -> int:
    """The most characters, runs of whitespace counted as one, that a prompt of `max_tokens` tokens can span: each
    token covers at most its longest entry's characters and one separator. No longer prompt is read whole."""
    return max_tokens * (longest_token_chars(tokenizer) + 1)


def check_prompt_lengths(prompts, limit: int, what: str) -> None:
    """Refuse, before any tokenizing (a 20 MB prompt took 98 s), a prompt no model of `limit` characters reads."""
    for prompt in prompts:
        if len(prompt) > limit and len(" ".join(prompt.split())) > limit:  # the split only for a long prompt
            raise ValueError(
                f"the {what} {shortened(prompt)!r} has {len(prompt):,} characters, and this model reads at most "
                f"{limit:,} (max_prompt_chars): shorten it."
            )


def shortened(prompt: str, most: int = 60) -> str:
    """A prompt as a message quotes it: a 5,000-character prompt must not fill the screen."""
    return prompt if len(prompt) <= most else prompt[: most - 3] + "..."


def left_padded_batch(
    conditional: list[list[int]],
    unconditional: list[list[int]] | None,
    num_images_per_prompt: int,
    pad_token_id: int,
    grid: ImageGrid | None = None,
) -> PromptBatch:
    """One row of token ids per prompt (and per prompt's unconditional twin, with guidance) -> a `PromptBatch`.

    Each row is repeated `num_images_per_prompt` times; rows are left-padded with `pad_token_id`, which the
    attention mask hides.
    """
    rows = [row for row in conditional for _ in range(num_images_per_prompt)]
    if unconditional is not None:
        rows += [row for row in unconditional for _ in range(num_images_per_prompt)]
    width = max(map(len, rows))
    input_ids = torch.tensor([[pad_token_id] * (width - len(r)) + r for r in rows])  # [B', P]
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # [B', P]
    batch_size = len(conditional) * num_images_per_prompt
    return PromptBatch(input_ids, attention_mask, batch_size, unconditional is not None, grid)


def left_padded_to_multiple(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask [B', P] left-padded, masked, to the next multiple of `multiple` tokens. The padding repeats
    each row's first id, a token every adapter can embed; the mask hides it."""
    extra = -input_ids.shape[1] % multiple
    ids = torch.cat([input_ids[:, :1].expand(-1, extra), input_ids], dim=1)
    return ids, torch.cat([attention_mask.new_zeros(attention_mask.shape[0], extra), attention_mask], dim=1)
