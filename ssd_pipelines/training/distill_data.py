"""Collection for self-distillation: AR images from the frozen backbone, with the hidden state at every cell.

A share of the images can instead be a drafter's own rollouts: decoded with
`ssd` and its heads, their states then read back by one pass over the decoded
grid. Those are the rows a drafter meets at inference, where the row above was
itself drafted and verified (on-policy data, as in DistillSpec).

A collection can be streamed to disk: each generated batch is a safetensors
shard, written as soon as it is done, so a long collection that is stopped
resumes where it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..backbones.base import ImageBackbone, PromptBatch
from ..decoding import ARDecoding
from ..decoding.block import Block
from ..decoding.output import DecodeOutput
from ..decoding.run import both_branches
from ..decoding.strategy import DecodingStrategy
from ..sampling_config import SamplingConfig


@dataclass
class DistillationData:
    """What the frozen backbone wrote, per image: h at every cell in each guidance branch, and the codes.

    hidden: [N, S, R, C, d], S = 2 with guidance (conditional, unconditional), else 1;
        16-bit on CPU, because it is nearly all of the memory.
    codes: [N, R, C] int32, shared by the branches.
    """

    hidden: torch.Tensor
    codes: torch.Tensor

    def __len__(self) -> int:
        return self.codes.shape[0]

    def __getitem__(self, index: torch.Tensor | slice) -> DistillationData:
        return DistillationData(self.hidden[index], self.codes[index])

    @property
    def nbytes(self) -> int:
        return self.hidden.nbytes + self.codes.nbytes

    @classmethod
    def concat(cls, parts: list[DistillationData]) -> DistillationData:
        return cls(torch.cat([p.hidden for p in parts]), torch.cat([p.codes for p in parts]))

    @classmethod
    def from_decode(cls, output: DecodeOutput, storage_dtype: torch.dtype | None = None) -> DistillationData:
        """Regroup an AR output's [B', R, C, d] states (conditional rows first) per image, stored compactly."""
        images = output.codes.shape[0]
        branches = output.hidden.shape[0] // images
        hidden = output.hidden.unflatten(0, (branches, images)).transpose(0, 1)
        stored = hidden.to("cpu", storage_dtype or _storage_dtype(hidden.dtype)).contiguous()
        if not torch.isfinite(stored).all():
            raise ValueError(
                f"the backbone's hidden states overflow {stored.dtype}: collect with "
                "storage_dtype=torch.bfloat16 (same range as float32) or torch.float32."
            )
        return cls(stored, output.codes.to("cpu", torch.int32))


def _storage_dtype(hidden_dtype: torch.dtype) -> torch.dtype:
    """16 bits a value: a bf16 backbone keeps bf16 (its range); fp32 and fp16 become fp16 (finer than bf16)."""
    return torch.bfloat16 if hidden_dtype == torch.bfloat16 else torch.float16


@torch.no_grad()
def teacher_forced_hidden(backbone: ImageBackbone, prompts: PromptBatch, codes: torch.Tensor) -> torch.Tensor:
    """The pre-norm state predicting every cell of grids another decoder chose, codes [B, R, C] -> [B', R, C, d],
    from one pass over them: what AR records as it samples."""
    grid = prompts.grid or backbone.grid
    state, h_before = backbone.prefill(prompts)
    block = Block(grid, 0, grid.num_cells)
    embeds = block.embed(backbone, both_branches(codes.flatten(1), prompts.guidance))
    hidden = block.predicting_hidden(h_before, backbone.extend(state, embeds))
    return hidden.unflatten(1, (grid.rows, grid.cols))


def rollout_images(images: int, batch_size: int, share: float) -> int:
    """How many of `images` (the first, in whole batches) are rollouts when a share `share` of them is asked for."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the rollout share is a share of the images: pass a value in [0, 1], got {share}.")
    batches = -(-round(share * images) // batch_size)
    return min(images, batches * batch_size)


def collect(
    backbone: ImageBackbone,
    prompts: list[str],
    sampling: SamplingConfig,
    images_per_prompt: int = 1,
    batch_size: int = 64,
    seed: int = 0,
    storage_dtype: torch.dtype | None = None,
    shards: Path | None = None,
    progress: bool = False,
    rollout: DecodingStrategy | None = None,
    rollout_share: float = 0.0,
) -> DistillationData:
    """Generate images_per_prompt images per prompt with AR, batch_size images per batch, recording h and codes.

    With `rollout` (e.g. `SSDDecoding(heads)`), the first batches, `rollout_images` of the images, are decoded by
    it instead, and their states read back with `teacher_forced_hidden`. Decoding is memory-bound, so a batch of
    64 images costs little more than one. With `shards`, every batch is also written there as it is done, and a
    batch already written is read back instead of generated again (the batch's own seed makes it the same either
    way).
    """
    images = [prompt for prompt in prompts for _ in range(images_per_prompt)]
    if not images:
        raise ValueError("collect needs at least one prompt and images_per_prompt >= 1.")
    rollouts = rollout_images(len(images), batch_size, rollout_share) if rollout is not None else 0
    strategy = ARDecoding(record_hidden=True)
    parts = []
    starts = range(0, len(images), batch_size)
    for index, start in enumerate(tqdm(starts, desc="generating", unit="batch", disable=not progress)):
        shard = None if shards is None else shards / f"batch-{index:05d}.safetensors"
        if shard is not None and shard.is_file():
            parts.append(DistillationData(**load_file(shard)))
            continue
        batch = backbone.encode_prompts(images[start : start + batch_size], guidance=sampling.uses_guidance)
        generator = torch.Generator(backbone.device).manual_seed(seed + 1_000_003 * index)  # its own stream
        if start < rollouts:
            output = rollout.decode(backbone, batch, sampling, generator=generator)
            output.hidden = teacher_forced_hidden(backbone, batch, output.codes)
        else:
            output = strategy.decode(backbone, batch, sampling, generator=generator)
        parts.append(DistillationData.from_decode(output, storage_dtype))
        if shard is not None:
            save_file({"hidden": parts[-1].hidden, "codes": parts[-1].codes}, shard)
    return DistillationData.concat(parts)


def shard_folder(data_dir: Path, settings: dict, process_index: int) -> Path:
    """This process's shard folder under `data_dir`, which must hold shards of these very settings (or none)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    recorded = data_dir / "collection.json"
    if recorded.is_file() and json.loads(recorded.read_text()) != settings:
        raise ValueError(
            f"{data_dir} holds generations made with other settings ({recorded}): use another --data-dir, "
            "or the same model, prompts, sampling, batch size and seed."
        )
    recorded.write_text(json.dumps(settings, indent=1))
    folder = data_dir / f"process-{process_index}"
    folder.mkdir(exist_ok=True)
    return folder
