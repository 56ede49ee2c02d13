"""What one decoding call costs: seconds, forward passes, tokens run through the backbone, peak memory, and
the seconds spent drafting (`drafting_clock`).

Seconds are the strategy's own (`DecodeStats.seconds`). Tokens are counted by a
thin wrapper around the backbone (`CountingBackbone`): the image positions each
pass runs per image, the prompt excluded, so a 64-token window costs 64 whether
or not its drafts are kept. Peak memory is what the call allocated above what
was live before it: on CUDA the allocator's own peak; on Linux CPUs the
process's peak resident set, reset before the call through /proc/self/clear_refs
(after `release_freed_memory`, large tensors go straight back to the system when
freed, so the resident set follows live tensors). Elsewhere it is not measured.
"""

from __future__ import annotations

import ctypes
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch

from ssd_pipelines.backbones.base import ImageBackbone
from ssd_pipelines.decoding import DecodeOutput, DecodingStrategy
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing.engine_probes import drafting_clock

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class CountingBackbone:
    """Forwards everything to a backbone, counting the image positions its passes run per image."""

    def __init__(self, backbone: ImageBackbone):
        self._backbone = backbone
        self.tokens = 0  # image positions run, summed over passes, per image of the batch

    def __getattr__(self, name):
        return getattr(self._backbone, name)

    def extend(self, state, embeds):
        self.tokens += embeds.shape[1]
        return self._backbone.extend(state, embeds)

    def extend_rows(self, state, embeds, starts, length):
        self.tokens += embeds.shape[1]
        return self._backbone.extend_rows(state, embeds, starts, length)

    def extend_at(self, state, embeds, positions, visible, slots=None):
        self.tokens += embeds.shape[1]
        return self._backbone.extend_at(state, embeds, positions, visible, slots)


def release_freed_memory() -> None:
    """Ask glibc to return every allocation above 64 KiB to the system when freed (no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD, fixed (no dynamic raise)
    except (OSError, AttributeError):
        pass


def _resident_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", _STATUS.read_text()).group(1))


class PeakMemory:
    """Context manager: `.bytes` is the peak allocated above the start, or None where it cannot be measured."""

    def __init__(self, device: torch.device):
        self.device = device
        self.bytes: int | None = None

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        elif _CLEAR_REFS.exists():
            try:
                _CLEAR_REFS.write_text("5")  # the peak resident set restarts from the current one
                self._start = _resident_kib("VmRSS") * 1024
            except OSError:
                self._start = None
        else:
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        else:
            self.bytes = max(0, _resident_kib("VmHWM") * 1024 - self._start)


@dataclass
class CallCost:
    """One decoding call of `images` images."""

    images: int
    seconds: float
    passes: int
    tokens: int  # image positions run per image
    peak_bytes: int | None
    output: DecodeOutput


def run_once(
    strategy: DecodingStrategy,
    backbone: ImageBackbone,
    prompts: list[str],
    sampling: SamplingConfig,
    seed: int,
    images_per_prompt: int = 1,
) -> CallCost:
    """Decode the prompts once with the strategy, measuring what the call cost."""
    counting = CountingBackbone(backbone)
    batch = backbone.encode_prompts(prompts, num_images_per_prompt=images_per_prompt, guidance=sampling.uses_guidance)
    with PeakMemory(backbone.device) as memory:
        out = strategy.decode(counting, batch, sampling, generator=torch.Generator().manual_seed(seed))
    return CallCost(batch.batch_size, out.stats.seconds, out.stats.forward_passes, counting.tokens, memory.bytes, out)


def one_image_call(pipe, prompt: str, guidance: float, seed: int, options: dict) -> dict:
    """One single-image pipeline call with `options`: its seconds, forward passes and share of time drafting."""
    with drafting_clock() as spent:
        out = pipe(
            prompt,
            guidance_scale=guidance,
            generator=torch.Generator().manual_seed(seed),
            output_type="latent",
            **options,
        )
    seconds = out.stats["seconds"]
    return {"seconds": seconds, "passes": out.stats["forward_passes"], "drafting": spent[0] / seconds}


def summarize_calls(calls: list[dict]) -> dict:
    """`one_image_call` results -> median seconds, mean passes (exact, so averaged) and median drafting share."""
    return {
        "seconds": statistics.median(c["seconds"] for c in calls),
        "passes": statistics.mean(c["passes"] for c in calls),
        "drafting": statistics.median(c["drafting"] for c in calls),
    }
