"""`SSDAutoregressivePipeline`: an autoregressive image generator with SSD decoding, the diffusers way.

The pipeline only registers components and calls the library: the backbone
adapter (`backbones/`) tokenizes and runs the model, a decoding strategy
(`decoding/`) writes the grid of codes, the VQ decoder turns it into pixels.
No decoding logic lives here.

A pipeline is served from worker threads (Gradio, ComfyUI): one call's state
lives in that call, and `_interrupt` is per thread, so concurrent calls on one
pipeline neither corrupt nor stop each other.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F
from diffusers import DiffusionPipeline, VQModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import BaseOutput
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .backbones import ImageBackbone, ImageGrid, adapter_for
from .backbones.compiled import uses_cuda_graphs
from .backbones.prompts import check_prompt_lengths
from .call_state import PerThreadInterrupt
from .decoding import DEFAULT_DECODING, UNDECODED, make_strategy, strategy_class
from .heads import DraftHeads
from .hub import HUB_OPTIONS, check_checkpoint, check_components, check_hub_base_model, resolve_source
from .loading import load_checkpoint, load_heads, load_pipeline_folder, stored_dtype
from .memory import check_batch_fits
from .quantization import backbone_quantization
from .request import OUTPUT_TYPES, GenerationRequest

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from ssd_pipelines import SSDAutoregressivePipeline

        >>> torch.set_num_threads(1)  # on a CPU: a small model gains little from more threads, and loses much on a busy machine
        >>> pipe = SSDAutoregressivePipeline.from_pretrained("hub_cards/ssd-reference")
        >>> out = pipe("a red circle left of a blue square", generator=torch.Generator().manual_seed(0))
        >>> out.images[0].save("circle.png")
        >>> out.stats["chosen_decoding"], out.stats["forward_passes"]  # "auto" chose "exact" for one image
        >>> fast = pipe("a red circle left of a blue square", decoding="ssd", verify_rounds=1)  # lossy
        ```
"""

DEVICE_MAP_OPTIONS = ("device_map", "max_memory", "offload_folder")  # accelerate, through transformers


COMPILING_ON_A_CPU = (
    "enable_compiled_passes() on a CPU: the first call compiles for minutes, and later calls are no faster "
    "(the reference model, one thread: 149 s, then 1.46 s a call against eager's 1.32 s; docs/decoding.md, "
    "'Compiled passes'). It is meant for a GPU: disable_compiled_passes() runs the passes eagerly again."
)


@dataclass
class SSDPipelineOutput(BaseOutput):
    """images: PIL images, an array [B, H, W, 3], a tensor [B, 3, H, W], or the codes for "latent".
    codes: the grid of image codes [B, R, C]. stats: the decoding statistics (`DecodeStats.to_dict()`).
    final_round: [B, R, C], the verification from which each cell's code stayed (0: drawn from the exact
    distribution; 1: its first draft kept; k >= 2: resampled in its (k - 1)-th verification; docs/decoding.md).
    interrupted / rows_completed: a stopped call decoded only its first `rows_completed` rows; the others
    are -1 in `codes` and `final_round`, and black in the images.
    warnings: what the call changed or could not read in its input (a prompt cut to the tokens the model reads,
    unknown words), and what ran otherwise than asked (a compiled pass that ran eagerly, and why), for the caller
    to show: also issued as Python warnings, which only a log sees."""

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    codes: torch.Tensor
    stats: dict
    final_round: torch.Tensor
    interrupted: bool
    rows_completed: int
    warnings: list[str]


class SSDAutoregressivePipeline(PerThreadInterrupt, DiffusionPipeline):
    r"""Text-to-image generation with an autoregressive backbone, decoded by Spatially Speculative Decoding.

    Components:
        backbone ([`~transformers.PreTrainedModel`]): the autoregressive image generator.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): its prompt tokenizer.
        vqvae ([`~diffusers.VQModel`], *optional*): turns codes into pixels; without it only `output_type="latent"`.
        heads ([`DraftHeads`], *optional*): drafting heads; needed by `decoding="ssd"`, `"exact"` and `"auto"`.
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

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, heads=None, **kwargs):
        """Load a pipeline folder or repository, a heads repository whose config names its base model, or the
        transformers checkpoint of a supported backbone (e.g. "deepseek-community/Janus-Pro-7B").

        heads: a `DraftHeads`, a folder or a repository id; replaces the pipeline's own heads.
        Hub options (`revision`, `cache_dir`, `local_files_only`, `token`, `force_download`) pass through. `dtype`
        applies to every component; without it all load in float32 (weights may be stored in half precision), so
        that backbone, heads and VQ decoder always agree; "auto": the dtype the backbone's weights are stored in.
        Weights load from safetensors only.
        device_map (with `max_memory`, `offload_folder`): how accelerate spreads the backbone over devices, e.g.
        "auto" for several GPUs; heads and VQ decoder then sit beside its last layer. quantization_config: diffusers'
        `PipelineQuantizationConfig` or transformers' config for the backbone (`ssd_pipelines.quantization`).
        backbone, tokenizer, vqvae: components to use instead of the saved ones (vqvae: a VQ decoder for a
        checkpoint that has none inside, Lumina-mGPT: `load_chameleon_vqgan`). Any other option is refused.
        """
        if kwargs.pop("use_safetensors", True) is not True:
            raise ValueError("SSD pipelines load only safetensors weights: drop use_safetensors (pickles are refused).")
        dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None) or torch.float32
        hub_options = {k: kwargs.pop(k) for k in HUB_OPTIONS if k in kwargs}
        # how transformers loads the backbone: spread over devices by accelerate, quantized
        backbone_options = {k: kwargs.pop(k) for k in DEVICE_MAP_OPTIONS if k in kwargs}
        quantization = backbone_quantization(kwargs.pop("quantization_config", None))
        if quantization is not None:
            backbone_options["quantization_config"] = quantization
        name = str(pretrained_model_name_or_path)
        source = resolve_source(name, **hub_options)
        folder = Path(source.location)
        if source.kind == "heads":  # load the base model the heads name, with them
            if heads is not None:
                raise ValueError(f"{name} is a heads repository: pass a pipeline with heads=..., not both.")
            heads = load_heads(folder)
            if not heads.config.base_model:
                raise ValueError(f"the heads in {name} do not name their base model: pass it, with heads=.")
            if not Path(name).expanduser().is_dir():
                check_hub_base_model(name, heads.config.base_model)
            hub_options.pop("revision", None)  # the revision was the heads'
            return cls.from_pretrained(
                heads.config.base_model, heads=heads, dtype=dtype, **hub_options, **backbone_options, **kwargs
            )
        if dtype == "auto":
            dtype = stored_dtype(folder, source.kind)
        if source.kind == "checkpoint":
            pipe = cls._from_checkpoint(folder, name, dtype, backbone_options, **kwargs)
        else:
            _check_options(kwargs, ("backbone", "tokenizer", "vqvae"), "a pipeline folder")
            check_components(folder, name)
            base_loader = super().from_pretrained
            pipe = load_pipeline_folder(base_loader, folder, name, backbone_options, dtype=dtype, **kwargs)
        try:
            _ = (
                pipe.image_backbone
            )  # the adapter reads what the backbone's config must say (its image grid, vocabulary)
        except ValueError as error:
            raise ValueError(f"could not load {name}: {error}") from error
        pipe.register_to_config(_name_or_path=name)  # the name asked for, not the snapshot folder
        if backbone_options:
            pipe._place_beside_backbone()
        if heads is not None:
            pipe.load_heads(heads, **hub_options)
        return pipe

    @classmethod
    def _from_checkpoint(
        cls, folder: Path, name: str, dtype, backbone_options: dict, vqvae: VQModel | None = None, **kwargs
    ):
        """A pipeline around a supported backbone's transformers checkpoint: its model and tokenizer, its own VQ
        decoder (Janus-Pro, Emu3) or `vqvae` (Lumina-mGPT), no heads."""
        _check_options(kwargs, ("vqvae",), "a transformers checkpoint")
        check_checkpoint(folder, name)
        backbone, tokenizer = load_checkpoint(folder, name, dtype, backbone_options)
        return cls(backbone, tokenizer, None if vqvae is None else vqvae.to(dtype=dtype).eval())

    def _place_beside_backbone(self) -> None:
        """Heads and VQ decoder on the device of the backbone's last layer, where their inputs are computed."""
        device = self.image_backbone.device
        for name in ("heads", "vqvae"):
            module = getattr(self, name)
            if module is not None:
                self.register_modules(**{name: module.to(device)})

    def load_heads(self, heads: DraftHeads | str | Path, **hub_options) -> None:
        """Plug drafting heads (a `DraftHeads`, a folder or a repository id) into the pipeline after checking they
        were made for this backbone."""
        heads = checked_heads(heads, self.image_backbone, self.backbone.dtype, self.config, **hub_options)
        self.register_modules(heads=heads)

    @property
    def image_backbone(self) -> ImageBackbone:
        """The backbone contract over the current components (cheap to build; follows `.to()`)."""
        return adapter_for(self.backbone, self.tokenizer, self.vqvae)

    def enable_compiled_passes(self, **compile_options) -> None:
        """Run the backbone's forward passes, and the decoding steps between them (drafting, verification, block
        `ssd`'s row of drafts), through `torch.compile` (`compile_options`: its keywords).

        By default dynamic=True: one compilation serves the passes of every width and batch. With dynamic=False, and
        by default with CUDA graphs (mode="reduce-overhead" or "max-autotune", or inductor's "triton.cudagraphs"),
        the passes over the image and the steps take static shapes, so that one graph serves every pass of a width
        (`CausalLMBackbone.compile_passes`), and prompts are padded to a multiple of 32 tokens. Under CUDA graphs the
        model's runner keeps the state its last call's graphs wrote (KV cache, codes) in one workspace, so that the
        next call of its shapes replays them; disabling frees it (`backbones/runner.py`).

        Opt-in, as diffusers leaves `torch.compile` to its users, and for GPUs: on a CPU it does not pay, and
        inductor there warns so. On the reference model, one thread, the first `auto` call compiled for 149 s and
        later calls took 1.46 s against eager's 1.32 s (docs/decoding.md, "Compiled passes";
        docs/probes/compiled_on_cpu.py). The codes are eager's for the same seed. Guidance, temperature, top-k and
        top-p enter the graphs as tensors, so other values compile nothing new; every compiled call runs on the
        model's one owning thread, its callback still in the caller's. Each call's `stats` count what ran compiled
        and eagerly and the graphs it compiled, and its `warnings` say why anything ran eagerly (a pass the backend
        cannot compile runs eagerly for those shapes from then on); moving the pipeline to another device or dtype
        compiles again on the next call (docs/decoding.md, "Compiled passes that hold")."""
        if self.device.type == "cpu" and compile_options.get("backend", "inductor") == "inductor":
            warnings.warn(COMPILING_ON_A_CPU, UserWarning, stacklevel=2)
        self.image_backbone.compile_passes({"dynamic": not uses_cuda_graphs(compile_options), **compile_options})

    def disable_compiled_passes(self) -> None:
        """Run the backbone's passes eagerly again, and free the state the CUDA-graph modes held."""
        self.image_backbone.compile_passes(None)

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def max_prompt_chars(self) -> int:
        """The longest prompt (or negative prompt), in characters with runs of whitespace as one, that the model can
        read whole: a longer one is refused before it is tokenized. Shorter ones past `max_prompt_tokens` are cut
        to those tokens, with a warning."""
        return self.image_backbone.max_prompt_chars

    def check_inputs(self, request: GenerationRequest, callback_tensor_inputs=(), callback=None) -> ImageGrid:
        """Check a request against this pipeline's components (what `GenerationRequest.build` could not judge);
        return the grid it asks for, or raise a `ValueError` that says what to pass instead."""
        if strategy_class(request.decoding).needs_heads and self.heads is None:
            raise ValueError(
                f"decoding={request.decoding!r} needs drafting heads and this pipeline has none: "
                "load them with `pipe.load_heads(...)` or `from_pretrained(..., heads=...)`, or use decoding='ar'."
            )
        if request.output_type != "latent" and not self.image_backbone.can_decode:
            raise ValueError(
                "this pipeline has no VQ decoder (vqvae): ask for output_type='latent' to get the codes, or load "
                "one (from_pretrained(..., vqvae=...))."
            )
        if callback is not None and not callable(callback):
            raise ValueError(
                f"callback_on_step_end must be a function called as callback(pipe, step, timestep, tensors), or "
                f"None, got {callback!r} ({type(callback).__name__})."
            )
        unknown = set(callback_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(
                f"callback_on_step_end_tensor_inputs {sorted(unknown)} are not available: use {self._callback_tensor_inputs}."
            )
        backbone = self.image_backbone
        check_prompt_lengths(request.prompts, backbone.max_prompt_chars, "prompt")
        check_prompt_lengths(request.negative_prompts or (), backbone.max_prompt_chars, "negative prompt")
        grid = backbone.grid_for_size(request.height, request.width)
        window = request.options.get("window")
        if window is not None and window > grid.sequence_length:
            raise ValueError(
                f"window={window} is wider than the whole image, {grid.sequence_length} positions "
                f"({grid.rows} rows of {grid.row_length}): pass at most {grid.sequence_length}, which verifies the "
                "whole image in each pass."
            )
        return grid

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        negative_prompt: str | list[str] | None = None,
        num_images_per_prompt: int = 1,
        height: int | None = None,
        width: int | None = None,
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        decoding: str = DEFAULT_DECODING,
        verify_rounds: int | None = None,
        vertical_rows: int | None = None,
        window: int | None = None,
        exact_max_batch: int | None = None,
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
            height, width: a size the backbone makes (one for Janus-Pro; Emu3 and Lumina-mGPT make several, see
                `image_backbone.grid_for_size`); None takes its default.
            guidance_scale: classifier-free guidance; 1 disables it (no unconditional branch). None takes the
                backbone's own default (3 for the reference model, 5 Janus-Pro, 3 Emu3, 4 Lumina-mGPT).
            temperature, top_k, top_p: sampling; temperature 0 is greedy.
            generator: the only source of randomness, on any device: one `torch.Generator`, which the whole batch
                draws from in order (an image's codes then depend on what it is batched with), or a list of
                `len(prompt) * num_images_per_prompt` generators, one per image in the order images come out
                (prompt by prompt, each prompt's images together: image i is prompt i // num_images_per_prompt).
                With a list each image draws only from its own generator, so its codes depend only on its prompt,
                seed and options, not on the batch (every decoding; "auto" within one choice of decoding;
                docs/decoding.md, "Seeds that do not depend on the batch", says where rounding can still differ).
            decoding: "auto" (the default, lossless: "exact" for small batches, "ar" for large ones; chosen by
                `ssd-bench reference`, docs/reference_benchmark.md), "ssd" (the paper's, lossy), "exact" (lossless)
                or "ar" (the baseline); or a published peer with its published defaults: "sjd", "sjd-pac", "gsd",
                "zipar", "mtp1d" (docs/decoding.md).
            verify_rounds: "ssd" only: the most verification rounds a block gets (default 2; 0 commits drafts
                unverified). Rounds stop early once a round rejects nothing in every image.
            vertical_rows: "ssd" only: rows drafted at once by the vertical heads (k_v, default 1).
            window: "exact": image positions each forward pass verifies per image (default one row with
                its end-of-line token). Wider windows take fewer passes, each processing more tokens. "ssd":
                pipelines the rows on that window, each cell verified at most `verify_rounds` times (default: the
                paper's row blocks; docs/ssd_pipelined.md measures both). "auto": the window of its "exact".
            exact_max_batch: "auto" only: the largest batch (len(prompt) * num_images_per_prompt images) decoded
                with "exact"; larger ones go to "ar" (default 1, measured on this project's CPU; 0: always "ar").
                `stats["chosen_decoding"]` says which decoded.
            output_type: "pil", "np", "pt", or "latent" for the grid of codes.
            callback_on_step_end: called as `callback(pipe, row, row, {"codes": codes})` after each committed
                row, in the calling thread; `codes` is a copy, -1 in rows not committed yet. Setting
                `pipe._interrupt = True` there stops this call (no other), and raising stops it too.
        Examples:
        """
        request = GenerationRequest.build(
            prompt,
            negative_prompt,
            num_images_per_prompt,
            height,
            width,
            guidance_scale,
            temperature,
            top_k,
            top_p,
            generator,
            decoding,
            output_type,
            verify_rounds=verify_rounds,
            vertical_rows=vertical_rows,
            window=window,
            exact_max_batch=exact_max_batch,
        )
        # 1. The grid, the sampling path and the strategy
        grid = self.check_inputs(request, callback_on_step_end_tensor_inputs, callback_on_step_end)
        backbone = self.image_backbone
        sampling = request.sampling_for(backbone.default_guidance_scale)
        strategy = make_strategy(request.decoding, self.heads, **request.options)
        check_batch_fits(backbone, request.num_images, sampling.uses_guidance, grid)  # before tokenizing them all
        # 2. The prompt batch (conditional rows, then unconditional ones when guided)
        batch = backbone.encode_prompts(
            list(request.prompts),
            None if request.negative_prompts is None else list(request.negative_prompts),
            request.num_images_per_prompt,
            guidance=sampling.uses_guidance,
            grid=grid,
        )
        check_batch_fits(backbone, batch.batch_size, batch.guidance, grid, prompt_width=batch.input_ids.shape[1])
        # 3. Decode, row by row
        self._interrupt = False
        with self.progress_bar(total=grid.rows) as progress:

            def on_row(row: int, codes: torch.Tensor) -> bool:
                progress.update()
                if callback_on_step_end is not None:
                    callback_on_step_end(self, row, row, {"codes": codes})
                return self.interrupt

            decoded = strategy.decode(
                backbone, batch, sampling, generator=request.generator, callback=on_row, grid=grid
            )
        # 4. Codes -> pixels
        images = decoded.codes if output_type == "latent" else self.decode_codes(decoded.codes, output_type)
        self.maybe_free_model_hooks()
        output = SSDPipelineOutput(
            images=images,
            codes=decoded.codes,
            stats=decoded.stats.to_dict(),
            final_round=decoded.final_round,
            interrupted=decoded.stats.interrupted,
            rows_completed=decoded.stats.rows_completed,
            warnings=[*batch.notes, *decoded.warnings],
        )
        return output if return_dict else output.to_tuple()

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor, output_type: str = "pil"):
        """A grid of codes [B, R, C] -> images ("pil", "np" or "pt"); cells that are -1 (not decoded) are black.

        For row previews from `callback_on_step_end` and for codes kept from `output_type="latent"`.
        """
        if output_type not in OUTPUT_TYPES[:-1]:
            raise ValueError(f"unknown output_type {output_type!r}: choose one of {', '.join(OUTPUT_TYPES[:-1])}.")
        backbone = self.image_backbone
        if not backbone.can_decode:
            raise ValueError("this pipeline has no VQ decoder (vqvae): it cannot turn codes into pixels.")
        _check_codes(codes, backbone)
        codes = codes.to(backbone.device)
        pixels = backbone.decode_codes(codes.clamp_min(0))  # [B, 3, H, W] in [0, 1]
        decoded = (codes != UNDECODED)[:, None].to(pixels)  # [B, 1, R, C], where the VQ decoder put the pixels
        pixels = pixels * F.interpolate(decoded, size=pixels.shape[-2:], mode="nearest")
        return self.image_processor.postprocess(pixels, output_type=output_type)


def _check_codes(codes, backbone: ImageBackbone) -> None:
    """Refuse, saying what to pass, codes that torch would fail on deep inside the VQ decoder (an embedding's
    IndexError) or that it would draw as something else (codes below -1 as code 0)."""
    native = backbone.grid
    if not isinstance(codes, torch.Tensor):
        got = f"a {type(codes).__name__}"
    elif codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        got = f"a tensor of {codes.dtype}"
    elif codes.dim() != 3:
        got = f"a tensor of shape {list(codes.shape)}{_reshape_hint(codes, backbone)}"
    elif codes.shape[0] == 0:
        got = "no images (a batch of 0)"
    elif not _makes_grid(backbone, *codes.shape[1:]):
        got = f"a {codes.shape[1]} x {codes.shape[2]} grid"
    elif codes.numel() and not UNDECODED <= codes.min() <= codes.max() < native.codebook_size:
        got = f"values from {codes.min().item()} to {codes.max().item()}"
    else:
        return
    raise ValueError(
        f"`codes` must be an integer tensor [B, R, C] on a grid this model makes ({native.rows} x {native.cols} at its "
        f"default size), with values in 0..{native.codebook_size - 1}, or -1 where not decoded; got {got}. Pass the "
        "codes of a call with output_type='latent', or those callback_on_step_end receives."
    )


def _reshape_hint(codes: torch.Tensor, backbone: ImageBackbone) -> str:
    """How to make [B, R, C] of a tensor of another rank: one grid gains its batch, flat codes their rows."""
    native = backbone.grid
    if codes.dim() == 2 and _makes_grid(backbone, *codes.shape):
        return " (for one image, pass codes[None])"
    if codes.dim() in (1, 2) and codes.shape[-1] and codes.shape[-1] % native.num_cells == 0:
        return f" (for flat codes of the default size, pass codes.reshape(-1, {native.rows}, {native.cols}))"
    return ""


def _makes_grid(backbone: ImageBackbone, rows: int, cols: int) -> bool:
    """Whether the backbone makes images of a rows x cols grid: one size only, or several (Emu3, Lumina-mGPT)."""
    (height, width), native = backbone.image_size, backbone.grid
    try:
        grid = backbone.grid_for_size(rows * height // native.rows, cols * width // native.cols)
    except ValueError:
        return False
    return (grid.rows, grid.cols) == (rows, cols)


FROM_PRETRAINED_OPTIONS = ("heads", "dtype", *HUB_OPTIONS, *DEVICE_MAP_OPTIONS, "quantization_config")


def _check_options(unknown: dict, components: tuple[str, ...], source: str) -> None:
    """Refuse options `from_pretrained` would not use (diffusers only warns, and ignores them)."""
    if unknown:
        raise ValueError(
            f"from_pretrained takes no option {', '.join(map(repr, sorted(unknown)))} for {source}: it takes "
            f"{', '.join(FROM_PRETRAINED_OPTIONS)}, and {' or '.join(components)} to replace a component."
        )


def checked_heads(
    heads: DraftHeads | str | Path, backbone: ImageBackbone, dtype: torch.dtype, config, **hub_options
) -> DraftHeads:
    """Drafting heads (a `DraftHeads`, a folder or a repository id) on the backbone's device in `dtype`, after
    checking they were made for it and, where they name one, for the pipeline `config` was loaded from."""
    if not isinstance(heads, DraftHeads):
        source = resolve_source(str(heads), **hub_options)
        if source.kind != "heads":
            raise ValueError(f"heads={heads!r} is a pipeline, not drafting heads: pass a heads folder or repository.")
        heads = load_heads(source.location)
    # torch's own `to`: diffusers 0.42's warns on every dtype cast that modules "should be kept in float32: []",
    # naming none (huggingface/diffusers#13872); heads keep no float32 modules.
    heads = torch.nn.Module.to(heads, device=backbone.device, dtype=dtype)
    heads.check_compatible(backbone)
    _check_base_model(heads.config.base_model, config.get("_name_or_path"))
    return heads


def _check_base_model(base: str | None, ours: str | None) -> None:
    """Heads name the model they were distilled from: refuse them for another Hub model, and warn when the pipeline
    came from a folder of another name (shapes that fit do not make drafts the backbone accepts)."""
    if not base or not ours or base == ours:
        return
    if not Path(ours).exists():
        raise ValueError(
            f"these heads were trained for {base!r}, not for {ours!r}: load the heads trained for {ours!r}."
        )
    if Path(ours).name != base.rstrip("/").split("/")[-1]:
        warnings.warn(
            f"these heads were trained for {base!r} and this pipeline was loaded from {ours!r}: their shapes fit, "
            f"but unless {ours!r} is a copy of {base!r} the backbone will reject most of their drafts ('exact' and "
            "'auto' stay lossless but slow, 'ssd' draws worse images). Load the heads trained for this backbone.",
            UserWarning,
            stacklevel=3,
        )


SSDAutoregressivePipeline.__call__.__doc__ += EXAMPLE_DOC_STRING
