"""Whether a batch fits: a lower bound on the memory a call needs, against what its device has free.

Checked before the prompts are tokenized (without them) and again once they are, before the first pass, so that a
batch that cannot fit (say `num_images_per_prompt=10**6`) is refused in a moment, with the largest batch that fits, instead of running until
the out-of-memory killer ends the process. A batch is never split behind the caller's back: diffusers' pipelines
decode what they are given, and a caller who wants more images makes several calls, with one generator per image so
that each image's codes do not depend on how the calls split them (docs/decoding.md, "Seeds that do not depend on
the batch").
"""

from __future__ import annotations

import psutil
import torch

from .backbones import ImageBackbone, ImageGrid


def check_batch_fits(
    backbone: ImageBackbone, images: int, guided: bool, grid: ImageGrid, prompt_width: int = 0
) -> None:
    """Raise a ValueError that says how many images fit when the key/value cache and activations of `images`
    images (two rows each when `guided`) with prompts `prompt_width` tokens wide alone exceed the free memory of the
    backbone's device; devices that do not say what is free are not checked."""
    free = free_bytes(backbone.device)
    if free is None:
        return
    per_image = backbone.memory_per_row(prompt_width, grid) * (2 if guided else 1)
    needed = per_image * images
    if needed <= free:
        return
    fits = free // per_image
    advice = (
        f"pass at most {fits} images a call (len(prompt) * num_images_per_prompt) and make several calls, with one "
        "generator per image so that each image's codes do not depend on the split"
        if fits
        else "free memory on it, or load the pipeline in a smaller dtype or on a larger device"
    )
    raise ValueError(
        f"{images} images need at least {_size(needed)} on {backbone.device} for their key/value cache and "
        f"activations ({_size(per_image)} an image), and it has {_size(free)} free: {advice}."
    )


def free_bytes(device: torch.device) -> int | None:
    """What a call may still allocate on `device`: the memory the system has available on the CPU; on CUDA, the
    device's free memory and what torch's caching allocator holds unused; None where torch cannot say."""
    if device.type == "cpu":
        return psutil.virtual_memory().available
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return None


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
