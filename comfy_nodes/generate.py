"""SSD Generate: prompt -> images, codes and statistics, with ComfyUI's progress bar, row previews and Cancel."""

from __future__ import annotations

import comfy.model_management
import comfy.utils
import torch

from ssd_pipelines import SSDAutoregressivePipeline

from .codes import CODES, SSDCodes
from .images import preview_image, to_comfy_images
from .loader import PIPELINE

DECODINGS = ("ssd", "exact", "ar")
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF  # what torch.Generator.manual_seed accepts, as ComfyUI's samplers allow


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


def decoding_options(decoding: str, rounds: int, k_v: int) -> dict:
    """Only the options a decoding takes: the pipeline refuses rounds and k_v outside ssd."""
    return {"verify_rounds": rounds, "vertical_rows": k_v} if decoding == "ssd" else {}


def format_stats(stats: dict) -> str:
    """The pipeline's statistics, one per line, for a text preview node."""
    acceptance = ", ".join("-" if rate is None else f"{rate:.2f}" for rate in stats["acceptance_per_round"]) or "-"
    return "\n".join(
        [
            f"decoding: {stats['strategy']}",
            f"images: {stats['images']}",
            f"forward passes: {stats['forward_passes']}",
            f"rows completed: {stats['rows_completed']}",
            f"seconds: {stats['seconds']:.2f}",
            f"acceptance per round: {acceptance}",
        ]
    )


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
        "Forward passes, seconds and acceptance per verification round.",
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
                        "default": 3.0,
                        "min": 0.0,
                        "max": 30.0,
                        "step": 0.1,
                        "tooltip": "Classifier-free guidance scale; 1 turns guidance off.",
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
                    list(DECODINGS),
                    {
                        "default": "ssd",
                        "tooltip": "ssd: the paper's, `rounds` verification rounds per row. exact: lossless, a window of one row verified past each image's frontier of final cells. ar: one code per forward pass.",
                    },
                ),
                "rounds": (
                    "INT",
                    {
                        "default": 2,
                        "min": 0,
                        "max": 16,
                        "tooltip": "ssd only: at most this many verification rounds per drafted block (fewer once a round rejects nothing); 0 keeps drafts unverified.",
                    },
                ),
                "k_v": (
                    "INT",
                    {
                        "default": 1,
                        "min": 1,
                        "max": 16,
                        "tooltip": "ssd only: rows drafted at once by the vertical heads; at most what the heads were trained for.",
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
        progress = RowProgress(pipeline.image_backbone.grid.rows, preview)
        out = pipeline(
            prompt,
            negative_prompt=negative_prompt or None,
            num_images_per_prompt=batch_size,
            guidance_scale=guidance,
            temperature=temperature,
            generator=torch.Generator().manual_seed(seed),  # a CPU generator drives any device, the same way
            decoding=decoding,
            **decoding_options(decoding, rounds, k_v),
            output_type="np",
            callback_on_step_end=progress,
        )
        images = to_comfy_images(out.images)
        codes = SSDCodes(out.codes, out.final_round, (images.shape[1], images.shape[2]))
        return images, codes, format_stats(out.stats)
