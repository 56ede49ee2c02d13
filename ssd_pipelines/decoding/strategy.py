"""The interface every decoding strategy offers: `decode` a prompt batch into a grid of image codes.

A strategy holds only settings; everything one call needs lives in its `DecodeRun` (run.py), so one strategy and
one backbone may serve concurrent calls. The callback runs after every committed row: progress bars and live
previews hang on it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch

from ..backbones.base import ImageBackbone, ImageGrid, PromptBatch
from ..backbones.compiled import CALL_REPORT, CompileReport
from ..sampling import RandomSource, SamplingConfig
from .batch_buckets import bucket, padded_prompts
from .catalog import DECODINGS
from .options import DecodingOption
from .output import DecodeOutput
from .run import DecodeRun

RowCallback = Callable[[int, torch.Tensor], bool | None]
"""Called as callback(row, codes [B, R, C]) once row `row` is committed; returning True stops decoding.
`codes` is a copy holding `UNDECODED` in every row after `row`."""


class DecodingStrategy(ABC):
    """Turns prompts into a grid of image codes through an `ImageBackbone`.

    The class attributes are what callers read about a strategy before making one: the pipeline checks a
    call against them. A strategy names itself; the rest is its entry in `catalog.DECODINGS`, which the CLI, the
    demo and the ComfyUI node read without importing torch."""

    name: ClassVar[str]
    # The rest is its `catalog.DecodingInfo`'s, copied by __init_subclass__; a strategy not in the catalog sets its own.
    summary: ClassVar[str]
    lossless: ClassVar[bool]
    needs_heads: ClassVar[bool] = False
    options: ClassVar[tuple[DecodingOption, ...]] = ()
    # Whether every draw of the strategy goes through `DecodeRun.noise_tape` or `DecodeRun.uniform`, so that a batch
    # padded to a bucket gives its real images their unpadded codes (`batch_buckets.py`): the engine's do.
    pads_batches: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls) and cls.name in DECODINGS:  # a subclass that keeps its parent's name keeps its rest
            info = DECODINGS[cls.name]
            for declared in ("summary", "lossless", "needs_heads", "options"):
                setattr(cls, declared, getattr(info, declared))

    def decode(
        self,
        backbone: ImageBackbone,
        prompts: PromptBatch,
        sampling: SamplingConfig,
        generator: RandomSource | list[torch.Generator] = None,
        callback: RowCallback | None = None,
        grid: ImageGrid | None = None,
    ) -> DecodeOutput:
        """Decode one image per conditional row of the prompt batch.

        generator: one torch.Generator the whole batch draws from in order, or one per image (a list, in the
        batch's order, or `ImageGenerators`): then each image draws only from its own (`sampling.ImageGenerators`)."""
        if sampling.uses_guidance != prompts.guidance:
            raise ValueError(
                f"guidance_scale={sampling.guidance_scale} needs a prompt batch "
                f"{'with' if sampling.uses_guidance else 'without'} unconditional rows: encode the prompts with "
                f"guidance={sampling.uses_guidance}."
            )
        # compiled passes run on their model's one owning thread, the callback relayed to this one
        return backbone.runner.run(
            lambda relayed: self._decode_call(backbone, prompts, sampling, generator, relayed, grid), callback
        )

    def _decode_call(self, backbone, prompts, sampling, generator, callback, grid) -> DecodeOutput:
        images = prompts.batch_size
        if self.pads_batches and backbone.runner.buckets_batches:  # few batch sizes, few graphs
            prompts = padded_prompts(prompts, bucket(images))
        run = DecodeRun(backbone, prompts, grid or backbone.grid, sampling, generator, callback, self.name, images)
        run.stats.round_cap = self.round_cap
        started = time.perf_counter()
        report = CompileReport()
        token = CALL_REPORT.set(report)  # this call's, in its own context: concurrent calls keep theirs
        try:
            with torch.inference_mode():
                self._decode(run)
        finally:
            CALL_REPORT.reset(token)
        run.stats.compiled_calls, run.stats.eager_calls = report.compiled, report.eager
        run.stats.graphs_compiled = report.graphs
        run.warnings.extend(report.warnings)
        if run.codes.device.type == "cuda":
            torch.cuda.synchronize(run.codes.device)
        run.stats.seconds = time.perf_counter() - started
        return run.output()

    @property
    def compile_key(self) -> tuple:
        """A strategy's settings, for the steps compiled as its methods (`compiled.signature`): numbers by value,
        modules (its heads) by identity, as dynamo guards them."""
        plain = (bool, int, float, str, type(None))
        settings = sorted((k, v if isinstance(v, plain) else id(v)) for k, v in vars(self).items())
        return type(self).__name__, tuple(settings)

    @property
    def round_cap(self) -> int | None:
        """The most verifications a cell gets, when the strategy stops there (lossy); None otherwise."""
        return None

    @abstractmethod
    def _decode(self, run: DecodeRun) -> None:
        """Fill `run.codes` in raster order, calling `run.rows_committed` as rows land."""
