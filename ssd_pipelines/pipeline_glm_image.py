"""`SSDGlmImagePipeline`: diffusers' `GlmImagePipeline` with its autoregressive stage decoded by our engine.

GLM-Image's AR model writes the prior tokens (a preview grid, then the large grid the DiT renders) one token a
forward pass; that stage is where users wait. This pipeline keeps every stock component, argument and output, and
replaces only `generate_prior_tokens` for text to image: the adapter (`backbones/glm_image.py`) runs the model, a
decoding strategy (`decoding/`) writes each grid, optionally with drafting `heads`. The DiT and VAE stage is the
stock pipeline's own `__call__`, handed our prior tokens.

Randomness: the stock pipeline reseeds torch's global generator from `generator.initial_seed()` for the AR stage and
seeds it from the first generator of a list only. Here the AR stage draws from copies of the caller's generators,
one per image when a list is given, and torch's global generator is never reseeded; the DiT then receives the
caller's generators untouched, so given the same prior tokens and seeds the images are the stock pipeline's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    GlmImagePipeline,
    GlmImageTransformer2DModel,
    PipelineQuantizationConfig,
)
from diffusers.pipelines.glm_image.pipeline_output import GlmImagePipelineOutput
from tqdm.auto import tqdm
from transformers import ByT5Tokenizer, GlmImageForConditionalGeneration, GlmImageProcessor, T5EncoderModel
from transformers.utils.quantization_config import QuantizationConfigMixin

from .backbones.glm_image import GlmImageBackbone
from .call_state import PerThreadInterrupt
from .decoding import check_options, make_strategy, options_for, strategy_class
from .heads import DraftHeads
from .hub import HUB_OPTIONS, component_class, pipeline_components
from .pipeline_ssd import checked_heads
from .sampling import random_source
from .sampling_config import SamplingConfig

AR_COMPONENT = "vision_language_encoder"
PIPELINE_MODULE = "glm_image"  # diffusers.pipelines.glm_image, as model_index.json names it
# What `generate` falls back to where the AR model's generation_config.json leaves a setting unset
# (transformers' `GenerationConfig._get_default_generation_params`): top_k=50 applies whenever it samples.
GENERATE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
NO_IMAGE_TO_IMAGE = (
    "image to image is not supported by SSDGlmImagePipeline yet (the GLM-Image adapter does not read condition "
    "images): use diffusers' GlmImagePipeline for it, e.g. GlmImagePipeline.from_pipe(pipe)."
)

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from ssd_pipelines import SSDGlmImagePipeline

        >>> pipe = SSDGlmImagePipeline.from_pretrained("zai-org/GLM-Image", dtype=torch.bfloat16).to("cuda")
        >>> out = pipe("a red fox in the snow", height=1024, width=1024, generator=torch.Generator().manual_seed(0))
        >>> out.images[0].save("fox.png")
        >>> out.stats["chosen_decoding"], out.stats["forward_passes"]  # "ar" without heads
        ```
"""


@dataclass
class SSDGlmImagePipelineOutput(GlmImagePipelineOutput):
    """The stock output (`images`) and what the AR stage did: `prior_token_ids` [B, 4 * H/32 * W/32], the upsampled
    large grid the DiT rendered (pass it back as `prior_token_ids=` to render it again); `stats`, the AR stage's
    counts (None when the caller passed `prior_token_ids`); `warnings`, what ran otherwise than asked."""

    prior_token_ids: torch.Tensor | None = None
    stats: dict | None = None
    warnings: list[str] | None = None


@dataclass(frozen=True)
class PriorTokens:
    """The AR stage's result: upsampled large-grid ids for the DiT, each grid's codes, statistics and warnings."""

    ids: torch.Tensor  # [B, 4 * R * C]
    preview: torch.Tensor  # [B, r, c]
    large: torch.Tensor  # [B, R, C]
    stats: dict
    warnings: list[str]


class SSDGlmImagePipeline(PerThreadInterrupt, GlmImagePipeline):
    r"""GLM-Image text to image with the AR stage decoded by Spatially Speculative Decoding.

    The components of `GlmImagePipeline`, and:
        heads ([`DraftHeads`], *optional*): drafting heads for the AR model; needed by `decoding="exact"`, `"ssd"`
            and `"auto"`. Saved and loaded with the pipeline.
    """

    _optional_components: ClassVar[list[str]] = ["heads"]

    def __init__(  # the stock annotations: diffusers' from_pipe shares the components whose types they name
        self,
        tokenizer: ByT5Tokenizer,
        processor: GlmImageProcessor,
        text_encoder: T5EncoderModel,
        vision_language_encoder: GlmImageForConditionalGeneration,
        vae: AutoencoderKL,
        transformer: GlmImageTransformer2DModel,
        scheduler: FlowMatchEulerDiscreteScheduler,
        heads: DraftHeads | None = None,
    ):
        super().__init__(tokenizer, processor, text_encoder, vision_language_encoder, vae, transformer, scheduler)
        self.register_modules(heads=None)
        if heads is not None:  # saved, passed or shared heads, checked against the AR model alike
            self.load_heads(heads)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, heads=None, **kwargs):
        """Load a GLM-Image pipeline folder or repository (the stock one, or one saved by this class).

        heads: a `DraftHeads`, a folder or a repository id; replaces the pipeline's own. dtype (or torch_dtype):
        every component's; without it all load in float32, so that the AR model and the heads agree.
        quantization_config: a transformers config quantizes the AR model; diffusers' `PipelineQuantizationConfig`
        quantizes what it names. Weights load from safetensors only; other options are diffusers'.
        """
        if kwargs.pop("use_safetensors", True) is not True:
            raise ValueError("SSD pipelines load only safetensors weights: drop use_safetensors (pickles are refused).")
        name = str(pretrained_model_name_or_path)
        folder = Path(name).expanduser()
        if folder.is_dir() and AR_COMPONENT not in kwargs:
            _check_ar_component(folder, name)
        kwargs["dtype"] = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None) or torch.float32
        quantization = _ar_quantization(kwargs.pop("quantization_config", None))
        if quantization is not None:
            kwargs["quantization_config"] = quantization
        hub_options = {k: kwargs[k] for k in HUB_OPTIONS if k in kwargs}
        pipe = super().from_pretrained(name, use_safetensors=True, **kwargs)
        if heads is not None:
            pipe.load_heads(heads, **hub_options)
        return pipe

    @classmethod
    def from_pipe(cls, pipeline, heads=None, **kwargs):
        """A pipeline sharing `pipeline`'s components (the same objects, as diffusers' `from_pipe`), with `heads`
        (a `DraftHeads`, a folder or a repository id) or the ones `pipeline` has."""
        pipe = super().from_pipe(pipeline, **kwargs)
        if heads is not None:
            pipe.load_heads(heads)
        return pipe

    def load_heads(self, heads: DraftHeads | str | Path, **hub_options) -> None:
        """Plug drafting heads into the pipeline after checking they were made for its AR model."""
        backbone = self.image_backbone
        self.register_modules(heads=checked_heads(heads, backbone, backbone.dtype, self.config, **hub_options))

    @property
    def image_backbone(self) -> GlmImageBackbone:
        """The adapter over the AR model and its processor (cheap to build; follows `.to()`)."""
        return GlmImageBackbone(self.vision_language_encoder, self.processor)

    def ar_sampling(
        self, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None
    ) -> SamplingConfig:
        """The AR stage's sampling: each setting the caller's, else the AR model's generation config's, else what
        `generate` would use (temperature 1, top_k 50, top_p 1); top_k=0 and top_p=1 turn them off. No guidance:
        the stock pipeline samples the AR stage unguided (the DiT guides on its own)."""
        config = self.vision_language_encoder.generation_config

        def read(name, given):
            if given is not None:
                return given
            stored = getattr(config, name, None)
            return GENERATE_DEFAULTS[name] if stored is None else stored

        top_k, top_p = read("top_k", top_k), read("top_p", top_p)
        return SamplingConfig(
            temperature=read("temperature", temperature),
            top_k=top_k or None,
            top_p=None if top_p == 1 else top_p,
            guidance_scale=1.0,
        )

    def generate_prior_tokens(
        self,
        prompt: str | list[str],
        height: int,
        width: int,
        image=None,
        device: torch.device | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        *,
        num_images_per_prompt: int = 1,
        decoding: str | None = None,
        sampling: SamplingConfig | None = None,
        **options,
    ):
        """The stock method's result (prior ids [B, 4 * H/32 * W/32], None, None), written by our engine: one row
        of ids per image (`num_images_per_prompt` per prompt), each drawn from its own generator when a list is
        given. `decoding`, `sampling` (default `ar_sampling()`) and `options` as in `__call__`."""
        if image is not None:
            raise ValueError(NO_IMAGE_TO_IMAGE)
        prior = self.decode_prior(
            [prompt] if isinstance(prompt, str) else list(prompt),
            height,
            width,
            num_images_per_prompt,
            generator,
            decoding,
            sampling or self.ar_sampling(),
            options,
        )
        return prior.ids.to(device or self._execution_device), None, None

    def decode_prior(
        self,
        prompts: list[str],
        height: int,
        width: int,
        num_images_per_prompt: int,
        generator,
        decoding: str | None,
        sampling: SamplingConfig,
        options: dict,
    ) -> PriorTokens:
        """Both grids of every image: the preview, then the large grid after it, each one decoding, under one
        progress bar over their rows."""
        backbone = self.image_backbone
        preview_grid, large_grid = backbone.grids_for_size(height, width)
        decoding = self.check_decoding(decoding, options)
        strategy = make_strategy(decoding, self.heads, **options_for(decoding, **options))
        images = len(prompts) * num_images_per_prompt
        counted = f"len(prompt) * num_images_per_prompt = {len(prompts)} * {num_images_per_prompt}"
        source = random_source(_copies(generator), images, counted)
        batch = backbone.encode_prompts(prompts, num_images_per_prompt=num_images_per_prompt, grid=large_grid)
        with self._rows_bar(preview_grid.rows + large_grid.rows) as bar:

            def on_row(row: int, codes: torch.Tensor) -> None:
                bar.update()

            preview = strategy.decode(backbone, batch, sampling, source, callback=on_row, grid=batch.grid)
            large_batch = backbone.after_preview(batch, preview.codes)
            large = strategy.decode(backbone, large_batch, sampling, source, callback=on_row, grid=large_batch.grid)
        ids = large.codes.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).flatten(1)  # the DiT's 16 px grid
        stats = _stats(decoding, preview.stats.to_dict(), large.stats.to_dict())
        return PriorTokens(ids, preview.codes, large.codes, stats, [*batch.notes, *preview.warnings, *large.warnings])

    def check_decoding(self, decoding: str | None, options: dict) -> str:
        """The decoding to run (None: "exact" with heads, "ar" without), after refusing options it does not take
        and a decoding that needs heads this pipeline lacks, saying what to pass."""
        decoding = decoding or ("ar" if self.heads is None else "exact")
        check_options(decoding, **options)
        if strategy_class(decoding).needs_heads and self.heads is None:
            raise ValueError(
                f"decoding={decoding!r} drafts with drafting heads and this pipeline has none: pass heads=... to "
                "SSDGlmImagePipeline.from_pretrained or from_pipe (or call pipe.load_heads(...)), or use decoding='ar'."
            )
        return decoding

    def _rows_bar(self, total: int):
        """A tqdm bar over the AR rows, configured as diffusers' own (`set_progress_bar_config`)."""
        return tqdm(total=total, **{"desc": "prior tokens (rows)", **getattr(self, "_progress_bar_config", {})})

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        image: torch.Tensor | PIL.Image.Image | np.ndarray | list | None = None,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int = 50,
        timesteps: list[int] | None = None,
        sigmas: list[float] | None = None,
        guidance_scale: float = 1.5,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        prior_token_ids: torch.Tensor | None = None,
        prior_token_image_ids: list[torch.Tensor] | None = None,
        source_image_grid_thw: list[torch.Tensor] | None = None,
        crops_coords_top_left: tuple[int, int] = (0, 0),
        output_type: str = "pil",
        return_dict: bool = True,
        attention_kwargs: dict | None = None,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
        max_sequence_length: int = 2048,
        decoding: str | None = None,
        verify_rounds: int | None = None,
        vertical_rows: int | None = None,
        window: int | None = None,
        exact_max_batch: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> SSDGlmImagePipelineOutput | tuple:
        r"""Generate images: `GlmImagePipeline.__call__`'s arguments and images, the AR stage decoded by our engine.

        Differences from the stock pipeline:
            image: refused (image to image is not supported yet; use `GlmImagePipeline`).
            height, width: multiples of 32 px; None takes `default_sample_size * vae_scale_factor` (1024).
            generator: one `torch.Generator` (the batch's AR stage draws from a copy of it, then the DiT from it as
                the stock pipeline does) or a list of `len(prompt) * num_images_per_prompt`, one per image: image i's
                prior tokens and latents come from generator i alone. torch's global generator is never reseeded
                (with generator=None both stages draw from it, as diffusers does).
            num_images_per_prompt: each image gets its own prior tokens (the stock pipeline repeats one prompt's).
            prior_token_ids: when given, no AR stage runs, and the call is the stock pipeline's.

        The AR stage (our additions):
            decoding: "exact" (lossless, fewer passes), "ssd" (lossy, fastest), "auto" (lossless: exact up to
                `exact_max_batch` images, ar past it) need heads; "ar" (one token a pass) does not. None: "exact"
                with heads, "ar" without.
            verify_rounds, vertical_rows, window, exact_max_batch: the decoding's options (docs/decoding.md).
            temperature, top_k, top_p: the AR sampling; None takes the AR model's generation config, and where that
                leaves one unset what `generate` applies (temperature 1, top_k 50, top_p 1; `ar_sampling`).
                temperature 0 is greedy; top_k=0 and top_p=1 turn them off.

        Returns `SSDGlmImagePipelineOutput`, a `GlmImagePipelineOutput` whose `stats` hold the AR stage's counts
        ("decoding", "chosen_decoding", "forward_passes", "seconds", and each grid's under "preview" and "large"),
        or `(images,)` with return_dict=False, as the stock pipeline.
        Examples:
        """
        if image is not None:
            raise ValueError(NO_IMAGE_TO_IMAGE)
        height = height or self.default_sample_size * self.vae_scale_factor
        width = width or self.default_sample_size * self.vae_scale_factor
        tensor_inputs = getattr(callback_on_step_end, "tensor_inputs", callback_on_step_end_tensor_inputs)
        stock = {
            "num_inference_steps": num_inference_steps,
            "timesteps": timesteps,
            "sigmas": sigmas,
            "guidance_scale": guidance_scale,
            "latents": latents,
            "negative_prompt_embeds": negative_prompt_embeds,
            "crops_coords_top_left": crops_coords_top_left,
            "output_type": output_type,
            "attention_kwargs": attention_kwargs,
            "callback_on_step_end": callback_on_step_end,
            "callback_on_step_end_tensor_inputs": list(tensor_inputs),
            "max_sequence_length": max_sequence_length,
        }
        prior = None
        if prior_token_ids is None:
            self.image_backbone.grids_for_size(height, width)  # the adapter's message before the stock one
            self.check_inputs(prompt, height, width, list(tensor_inputs), prompt_embeds, negative_prompt_embeds)
            options = {
                "verify_rounds": verify_rounds,
                "vertical_rows": vertical_rows,
                "window": window,
                "exact_max_batch": exact_max_batch,
            }
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            sampling = self.ar_sampling(temperature, top_k, top_p)
            prior = self.decode_prior(
                prompts, height, width, num_images_per_prompt, generator, decoding, sampling, options
            )
            # one prompt a row, so that the stock call renders each image's own prior tokens
            prompt = [p for p in prompts for _ in range(num_images_per_prompt)]
            prior_token_ids, num_images_per_prompt = prior.ids.to(self._execution_device), 1
        images = super().__call__(
            prompt=prompt,
            height=height,
            width=width,
            num_images_per_prompt=num_images_per_prompt,
            generator=generator,
            prompt_embeds=prompt_embeds,
            prior_token_ids=prior_token_ids,
            prior_token_image_ids=prior_token_image_ids,
            source_image_grid_thw=source_image_grid_thw,
            return_dict=False,
            **stock,
        )[0]
        if not return_dict:
            return (images,)
        return SSDGlmImagePipelineOutput(
            images=images,
            prior_token_ids=prior_token_ids,
            stats=None if prior is None else prior.stats,
            warnings=[] if prior is None else prior.warnings,
        )


def _copies(generator):
    """Generators the AR stage draws from, in the caller's generators' states, so that the DiT's latents come
    from the caller's as in the stock pipeline, and torch's global generator is never reseeded."""
    if isinstance(generator, torch.Generator):
        return _copy(generator)
    if isinstance(generator, (list, tuple)):
        return [_copy(g) if isinstance(g, torch.Generator) else g for g in generator]
    return generator


def _copy(generator: torch.Generator) -> torch.Generator:
    return torch.Generator(device=generator.device).set_state(generator.get_state())


def _stats(decoding: str, preview: dict, large: dict) -> dict:
    """One call's AR counts: totals over both grids, and each grid's own."""
    return {
        "decoding": decoding,
        "chosen_decoding": large["chosen_decoding"] or decoding,
        "forward_passes": preview["forward_passes"] + large["forward_passes"],
        "seconds": preview["seconds"] + large["seconds"],
        "preview": preview,
        "large": large,
    }


def _check_ar_component(folder: Path, name: str) -> None:
    """A pipeline folder without the AR model cannot write prior tokens: say what to load instead. Every component
    must come from a library we load from (`hub.component_class`): a folder's files are never run as code."""
    components = pipeline_components(folder)
    for component, (library, class_name) in components.items():
        # diffusers names the pipeline's own module for the AR model and processor: transformers' classes it imports
        component_class(name, component, "transformers" if library == PIPELINE_MODULE else library, class_name)
    if AR_COMPONENT not in components or not (folder / AR_COMPONENT).is_dir():
        raise ValueError(
            f"could not load {name} as an SSDGlmImagePipeline: it has no '{AR_COMPONENT}' (GLM-Image's AR model, "
            "whose prior tokens SSD decodes). Load a complete GLM-Image pipeline folder (zai-org/GLM-Image), or "
            f"pass the model: from_pretrained(..., {AR_COMPONENT}=GlmImageForConditionalGeneration.from_pretrained(...))."
        )


def _ar_quantization(config):
    """A transformers quantization config applies to the AR model; diffusers' `PipelineQuantizationConfig` is
    diffusers' to apply."""
    if config is None or isinstance(config, PipelineQuantizationConfig):
        return config
    if isinstance(config, QuantizationConfigMixin):
        return PipelineQuantizationConfig(quant_mapping={AR_COMPONENT: config})
    raise TypeError(
        "quantization_config must be diffusers' PipelineQuantizationConfig or a transformers quantization config for "
        f"the AR model (e.g. TorchAoConfig(Int8WeightOnlyConfig())); got a {type(config).__name__}."
    )


SSDGlmImagePipeline.__call__.__doc__ += EXAMPLE_DOC_STRING
