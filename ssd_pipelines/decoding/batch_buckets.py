"""Batch sizes in a few buckets, padded, so that compiled passes serve any batch with a few graphs (issue 51).

Under `enable_compiled_passes` each pass and step is compiled (and under CUDA graphs recorded) once per batch size
(`DecodeRun.compile_key`), so a server whose users send 1 to 64 images would compile every size anew. A compiled
call's batch is therefore padded to the next bucket: 1, 2, 4, 8, 16, 32, 64, then multiples of 64. A padding image
is a clone of the batch's last image, its prompt rows and its noise, so it goes where that image goes: every
image's progress, and so the passes, are the unpadded batch's; the real images draw exactly what they draw
unpadded; the output, the callback's codes and the statistics hold the real images alone.
"""

from __future__ import annotations

import dataclasses

import torch

from ..backbones.base import PromptBatch

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket(images: int) -> int:
    """The batch size a compiled call of `images` images runs at."""
    for size in BUCKETS:
        if images <= size:
            return size
    return -(-images // BUCKETS[-1]) * BUCKETS[-1]


def padded_prompts(prompts: PromptBatch, images: int) -> PromptBatch:
    """The batch with its last image's rows repeated, in each guidance branch, up to `images` images."""
    extra = images - prompts.batch_size
    if extra == 0:
        return prompts

    def padded(rows: torch.Tensor) -> torch.Tensor:  # [B', P]: conditional rows, then their unconditional twins
        branches = rows.chunk(2) if prompts.guidance else (rows,)
        return torch.cat([torch.cat([branch, branch[-1:].expand(extra, -1)]) for branch in branches])

    return dataclasses.replace(
        prompts,
        input_ids=padded(prompts.input_ids),
        attention_mask=padded(prompts.attention_mask),
        batch_size=images,
    )


def real_rows(x: torch.Tensor, images: int, batch: int) -> torch.Tensor:
    """A padded batch's tensor [B, ...] or [2B, ...] (both guidance branches) -> its real images' rows."""
    if x.shape[0] == batch:
        return x[:images]
    return torch.cat([x[:images], x[batch : batch + images]])
