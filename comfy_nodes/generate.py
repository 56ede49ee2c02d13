"""SSD Generate: prompt -> images, codes and statistics, with ComfyUI's progress bar, row previews and Cancel."""

from __future__ import annotations

import logging
import warnings

import comfy.model_management
import comfy.utils
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.decoding import DECODINGS, DEFAULT_DECODING, USER_DECODINGS, decoding_label, options_for
from ssd_pipelines.seeds import MAX_SEED  # what torch.Generator.manual_seed takes; ComfyUI's samplers allow as much

from .codes import CODES, SSDCodes
from .images import preview_image, to_comfy_images
from .loader import PIPELINE

ROUNDS = DECODINGS["ssd"].option("verify_rounds")  # the node's `rounds`
K_V = DECODINGS["ssd"].option("vertical_rows")  # the node's `k_v`
MAX_GUIDANCE = 30.0
MODEL_GUIDANCE = 0.0  # the guidance input's "the model's own scale"
LOG = logging.getLogger(__name__)  # propagates to ComfyUI's handler on the root logger, its console and log file


class RowProgress:
    """The pipeline's per-row callback: honour ComfyUI's Cancel, then advance its progress bar with a preview.

    The interrupt is checked here, after each committed row (so between forward passes), because the progress
    hook that also checks it is throttled in newer ComfyUI versions.
    """

    def __init__(self, rows: int, preview: bool):
        self.bar = comfy.utils.ProgressBar(rows)
        self.preview = preview

    def __call__(self, pipe: SSDAutoregressivePipeline, row: int, timestep: int, callback_kwargs: dict) -> dict:
        comfy.model_management.throw_exception_if_processing_interrupted()
        image = None
        if self.preview:
            partial = pipe.decode_codes(callback_kwargs["codes"][:1], output_type="pil")[0]  # rows below are black
            image = ("PNG", preview_image(partial), None)
        self.bar.update_absolute(row + 1, preview=image)
        return {}


def format_stats(stats: dict, guidance: float, notes: list[str]) -> str:
    """The pipeline's statistics, one per line, for a text preview node; then what it changed in the prompt."""
    lines = [
        f"decoding: {decoding_label(stats)}",
        f"images: {stats['images']}",
        f"forward passes: {stats['forward_passes']}",
        f"rows completed: {stats['rows_completed']}",
        f"seconds: {stats['seconds']:.2f}",
        f"acceptance per round: {format_rates(stats['acceptance_per_round'])}",
        f"guidance: {guidance:g}",
    ]
    return "\n".join(lines + [f"warning: {note}" for note in notes])


class SSDGenerate:
    DESCRIPTION = (
        "Text to image with an autoregressive model, decoded by Spatially Speculative Decoding: drafting heads "
        "propose a row at a time and the backbone verifies it. 'ar' is the one-code-per-pass baseline; 'exact' "
        "verifies until nothing changes and matches ar's distribution."
    )
    CATEGORY = "SSD"
    FUNCTION = "generate"
    RETURN_TYPES = ("IMAGE", CODES, "STRING")
    RETURN_NAMES = ("images", "codes", "stats")
    OUTPUT_TOOLTIPS = (
        "The images [B, H, W, 3], values in 0..1.",
        "The code grid and the round each cell became final in, for SSD Decode Codes and SSD Acceptance Map.",
        "Forward passes, seconds, acceptance per verification round, the guidance used, and warnings about the prompt.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "pipeline": (PIPELINE, {"tooltip": "From SSD Pipeline Loader."}),
                "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": "What to draw."}),
                "negative_prompt": (
                    "STRING",
                    {
                        "multiline": True,
                        "default": "",
                        "tooltip": "Fills guidance's unconditional branch; empty uses the empty prompt.",
                    },
                ),
                "seed": (
                    "INT",
                    {
                        "default": 0,
                        "min": 0,
                        "max": MAX_SEED,
                        "control_after_generate": True,
                        "tooltip": "Seed of the only random generator the decoding uses.",
                    },
                ),
                "batch_size": (
                    "INT",
                    {"default": 1, "min": 1, "max": 64, "tooltip": "Images drawn for the prompt, decoded together."},
                ),
                "guidance": (
                    "FLOAT",
                    {
                        "default": MODEL_GUIDANCE,
                        "min": MODEL_GUIDANCE,
                        "max": MAX_GUIDANCE,
                        "step": 0.1,
                        "tooltip": "Classifier-free guidance scale. 0: the model's own (3 for the reference model, "
                        "5 for Janus-Pro); 1 turns guidance off; values between 0 and 1 are refused.",
                    },
                ),
                "temperature": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 2.0,
                        "step": 0.05,
                        "tooltip": "Sampling temperature; 0 is greedy.",
                    },
                ),
                "decoding": (
                    list(USER_DECODINGS),
                    {
                        "default": DEFAULT_DECODING,
                        "tooltip": "\n".join(f"{name}: {DECODINGS[name].summary}" for name in USER_DECODINGS),
                    },
                ),
                "rounds": (
                    "INT",
                    {
                        "default": ROUNDS.default,
                        "min": ROUNDS.minimum,
                        "max": 16,
                        "tooltip": f"ssd only: {ROUNDS.about}.",
                    },
                ),
                "k_v": (
                    "INT",
                    {
                        "default": K_V.default,
                        "min": K_V.minimum,
                        "max": 16,
                        "tooltip": f"ssd only: {K_V.about}; at most what the heads were trained for.",
                    },
                ),
                "preview": (
                    "BOOLEAN",
                    {
                        "default": True,
                        "tooltip": "Show the first image on the node after each row (one VQ decode per row).",
                    },
                ),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, guidance: float) -> bool | str:
        """Refuse a guidance in (0, 1) when the prompt is queued, not once the run is under way (the pipeline needs
        >= 1). ComfyUI then skips its own min/max check of `guidance`, so this checks the whole range."""
        if guidance == MODEL_GUIDANCE or 1.0 <= guidance <= MAX_GUIDANCE:
            return True
        return (
            f"{guidance:g} is no guidance scale: 0 takes the model's own, 1 turns guidance off, "
            f"and scales go from 1 to {MAX_GUIDANCE:g}."
        )

    def generate(
        self,
        pipeline: SSDAutoregressivePipeline,
        prompt: str,
        negative_prompt: str,
        seed: int,
        batch_size: int,
        guidance: float,
        temperature: float,
        decoding: str,
        rounds: int,
        k_v: int,
        preview: bool,
    ) -> tuple[torch.Tensor, SSDCodes, str]:
        if guidance == MODEL_GUIDANCE:
            guidance = pipeline.image_backbone.default_guidance_scale
        progress = RowProgress(pipeline.image_backbone.grid.rows, preview)
        options = options_for(decoding, verify_rounds=rounds, vertical_rows=k_v)
        with warnings.catch_warnings():  # the output's warnings are logged once, below, not also as Python warnings
            warnings.simplefilter("ignore", UserWarning)
            out = pipeline(
                prompt,
                negative_prompt=negative_prompt or None,
                num_images_per_prompt=batch_size,
                guidance_scale=guidance,
                temperature=temperature,
                generator=torch.Generator().manual_seed(seed),  # a CPU generator drives any device, the same way
                decoding=decoding,
                **options,
                output_type="np",
                callback_on_step_end=progress,
            )
        for note in out.warnings:
            LOG.warning("SSD Generate: %s", note)
        images = to_comfy_images(out.images)
        # A cell resampled in ssd's last round was never checked again; exact and ar have no last round.
        codes = SSDCodes(out.codes, out.final_round, (images.shape[1], images.shape[2]), out.stats["round_cap"])
        return images, codes, format_stats(out.stats, guidance, out.warnings)
