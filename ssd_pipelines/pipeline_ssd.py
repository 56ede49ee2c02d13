"""`SSDAutoregressivePipeline`: an autoregressive image generator with SSD decoding, the diffusers way.

The pipeline only registers components and calls the library: the backbone
adapter (`backbones/`) tokenizes and runs the model, a decoding strategy
(`decoding/`) writes the grid of codes, the VQ decoder turns it into pixels.
No decoding logic lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, VQModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import BaseOutput
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .backbones import ImageBackbone, adapter_for
from .decoding import STRATEGIES, make_strategy
from .heads import DraftHeads
from .hub import WEIGHTS_FAULTS, load_heads, resolve_source
from .sampling import SamplingConfig

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from ssd_pipelines import SSDAutoregressivePipeline

        >>> pipe = SSDAutoregressivePipeline.from_pretrained("hub_cards/ssd-reference")
        >>> out = pipe("a red circle left of a blue square", decoding="ssd", verify_rounds=1,
        ...            generator=torch.Generator().manual_seed(0))
        >>> out.images[0].save("circle.png")
        >>> out.stats["forward_passes"], out.stats["acceptance_per_round"]
        ```
"""

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def _register_with_diffusers() -> None:
    """Let diffusers save, download and load our `DraftHeads` component as it does its own and transformers'.

    Without this, diffusers records a component from an unknown library under its module path and, loading
    from the Hub, looks for that module as a remote code file.
    """
    from diffusers.pipelines import pipeline_loading_utils as loading

    methods = {DraftHeads.__name__: ["save_pretrained", "from_pretrained"]}
    loading.LOADABLE_CLASSES.setdefault(__name__.split(".")[0], methods)
    loading.ALL_IMPORTABLE_CLASSES.update(methods)


_register_with_diffusers()


@dataclass
class SSDPipelineOutput(BaseOutput):
    """images: PIL images, an array [B, H, W, 3], a tensor [B, 3, H, W], or the codes for "latent".
    codes: the grid of image codes [B, R, C]. stats: the decoding statistics (`DecodeStats.to_dict()`)."""

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    codes: torch.Tensor
    stats: dict


class SSDAutoregressivePipeline(DiffusionPipeline):
    r"""Text-to-image generation with an autoregressive backbone, decoded by Spatially Speculative Decoding.

    Components:
        backbone ([`~transformers.PreTrainedModel`]): the autoregressive image generator.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): its prompt tokenizer.
        vqvae ([`~diffusers.VQModel`], *optional*): turns codes into pixels; without it only `output_type="latent"`.
        heads ([`DraftHeads`], *optional*): drafting heads; needed by `decoding="ssd"` and `"exact"`.
    """

    model_cpu_offload_seq = "backbone->vqvae"
    _optional_components: ClassVar[list[str]] = ["vqvae", "heads"]
    _callback_tensor_inputs: ClassVar[list[str]] = ["codes"]

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        vqvae: VQModel | None = None,
        heads: DraftHeads | None = None,
    ):
        super().__init__()
        self.register_modules(backbone=backbone, tokenizer=tokenizer, vqvae=vqvae, heads=heads)
        self.image_processor = VaeImageProcessor(do_normalize=False)
        self._interrupt = False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, heads=None, **kwargs):
        """Load a pipeline folder or repository, or a heads repository whose config names its base model.

        heads: a `DraftHeads`, a folder or a repository id; replaces the pipeline's own heads.
        Hub options (`revision`, `cache_dir`, `local_files_only`, `token`) and `dtype` pass through.
        Weights load from safetensors only; pickled checkpoints are refused.
        """
        hub_options = {k: kwargs[k] for k in ("revision", "cache_dir", "local_files_only", "token") if k in kwargs}
        source = resolve_source(str(pretrained_model_name_or_path), **hub_options)
        if source.kind == "heads":
            if heads is not None:
                raise ValueError(
                    f"{pretrained_model_name_or_path} is a heads repository: pass a pipeline with heads=..., not both."
                )
            heads = load_heads(source.location)
            if not heads.config.base_model:
                raise ValueError(
                    f"the heads in {pretrained_model_name_or_path} do not name their base model: pass it, with heads=."
                )
            kwargs = {k: v for k, v in kwargs.items() if k != "revision"}  # the revision was the heads'
            return cls.from_pretrained(heads.config.base_model, heads=heads, **kwargs)
        try:
            pipe = super().from_pretrained(source.location, use_safetensors=True, **kwargs)
        except WEIGHTS_FAULTS as error:
            raise ValueError(
                f"could not load the pipeline {pretrained_model_name_or_path}: {error}. Its weights must be readable "
                "safetensors files: re-download them (force_download=True) or re-save the pipeline."
            ) from error
        if heads is not None:
            pipe.load_heads(heads, **hub_options)
        return pipe

    def load_heads(self, heads: DraftHeads | str | Path, **hub_options) -> None:
        """Plug drafting heads into the pipeline after checking they were made for this backbone."""
        if not isinstance(heads, DraftHeads):
            source = resolve_source(str(heads), **hub_options)
            if source.kind != "heads":
                raise ValueError(
                    f"heads={heads!r} is a pipeline, not drafting heads: pass a heads folder or repository."
                )
            heads = load_heads(source.location)
        heads.check_compatible(self.image_backbone)
        base = heads.config.base_model
        ours = self.config.get("_name_or_path")
        if base and ours and not Path(ours).exists() and base != ours:
            raise ValueError(
                f"these heads were trained for {base!r}, not for {ours!r}: load the heads trained for {ours!r}."
            )
        self.register_modules(heads=heads.to(device=self.device, dtype=self.backbone.dtype))

    @property
    def image_backbone(self) -> ImageBackbone:
        """The backbone contract over the current components (cheap to build; follows `.to()`)."""
        return adapter_for(self.backbone, self.tokenizer, self.vqvae)

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(
        self, prompt, negative_prompt, num_images_per_prompt, decoding, output_type, callback_tensor_inputs
    ):
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise ValueError(
                f"`prompt` must be a non-empty string or a list of them, got {prompt!r}: describe the image."
            )
        if negative_prompt is not None:
            negatives = [negative_prompt] if isinstance(negative_prompt, str) else negative_prompt
            if len(negatives) != len(prompts):
                raise ValueError(
                    f"got {len(negatives)} negative prompts for {len(prompts)} prompts: pass one per prompt."
                )
        if num_images_per_prompt < 1:
            raise ValueError(f"`num_images_per_prompt` must be >= 1, got {num_images_per_prompt}.")
        if decoding not in STRATEGIES:
            raise ValueError(f"unknown decoding {decoding!r}: choose one of {', '.join(STRATEGIES)}.")
        if decoding != "ar" and self.heads is None:
            raise ValueError(
                f"decoding={decoding!r} needs drafting heads and this pipeline has none: "
                "load them with `pipe.load_heads(...)` or `from_pretrained(..., heads=...)`, or use decoding='ar'."
            )
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}: choose one of {', '.join(OUTPUT_TYPES)}.")
        if output_type != "latent" and self.vqvae is None:
            raise ValueError("this pipeline has no VQ decoder (vqvae): ask for output_type='latent' to get the codes.")
        unknown = set(callback_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(
                f"callback_on_step_end_tensor_inputs {sorted(unknown)} are not available: use {self._callback_tensor_inputs}."
            )
        return prompts, (None if negative_prompt is None else negatives)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        negative_prompt: str | list[str] | None = None,
        num_images_per_prompt: int = 1,
        height: int | None = None,
        width: int | None = None,
        guidance_scale: float = 3.0,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        decoding: str = "ssd",
        verify_rounds: int = 2,
        adaptive: bool = False,
        vertical_rows: int = 1,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: list[str] = ("codes",),
    ) -> SSDPipelineOutput | tuple:
        r"""Generate images.

        Args:
            prompt: what to draw; a list makes a batch.
            negative_prompt: fills the unconditional branch of guidance instead of the empty prompt.
            num_images_per_prompt: images drawn for each prompt, in the same batch.
            height, width: must be what the backbone makes (its native grid); None takes them.
            guidance_scale: classifier-free guidance; 1 disables it (no unconditional branch).
            temperature, top_k, top_p: sampling; temperature 0 is greedy.
            generator: the only source of randomness.
            decoding: "ssd" (the paper's, `verify_rounds` rounds), "exact" (lossless) or "ar" (the baseline).
            verify_rounds: rounds of verification per row for "ssd" (0 commits drafts unverified).
            adaptive: for "ssd", stop a row's rounds once a round rejects nothing.
            vertical_rows: rows drafted at once by the vertical heads (k_v).
            output_type: "pil", "np", "pt", or "latent" for the grid of codes.
            callback_on_step_end: called as `callback(pipe, row, row, {"codes": codes})` after each committed
                row; may return a dict (ignored) and may set `pipe._interrupt = True` to stop early.
        Examples:
        """
        prompts, negatives = self.check_inputs(
            prompt, negative_prompt, num_images_per_prompt, decoding, output_type, callback_on_step_end_tensor_inputs
        )
        backbone = self.image_backbone
        # 1. The grid, the sampling path and the strategy
        grid = backbone.grid_for_size(height, width)
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=guidance_scale)
        options = {} if decoding == "ar" else {"vertical_rows": vertical_rows}
        if decoding == "ssd":
            options.update(verify_rounds=verify_rounds, adaptive=adaptive)
        strategy = make_strategy(decoding, self.heads, **options)
        # 2. The prompt batch (conditional rows, then unconditional ones when guided)
        batch = backbone.encode_prompts(prompts, negatives, num_images_per_prompt, guidance=sampling.uses_guidance)
        # 3. Decode, row by row
        self._interrupt = False
        with self.progress_bar(total=grid.rows) as progress:

            def on_row(row: int, codes: torch.Tensor) -> bool:
                progress.update()
                if callback_on_step_end is not None:
                    callback_on_step_end(self, row, row, {"codes": codes})
                return self.interrupt

            decoded = strategy.decode(backbone, batch, sampling, generator=generator, callback=on_row, grid=grid)
        # 4. Codes -> pixels
        if output_type == "latent":
            images = decoded.codes
        else:
            images = self.image_processor.postprocess(backbone.decode_codes(decoded.codes), output_type=output_type)
        self.maybe_free_model_hooks()
        stats = decoded.stats.to_dict()
        if not return_dict:
            return images, decoded.codes, stats
        return SSDPipelineOutput(images=images, codes=decoded.codes, stats=stats)


SSDAutoregressivePipeline.__call__.__doc__ += EXAMPLE_DOC_STRING
