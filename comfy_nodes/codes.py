"""The SSD_CODES type and the two nodes that read it: SSD Decode Codes and SSD Acceptance Map.

Codes are not a LATENT: LATENT nodes expect a float tensor [B, C, H, W] to sample or VAE-decode, and a grid of
VQ code indices means nothing to them. A custom type keeps them from being wired to those nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.acceptance import cell_colours, legend_lines

from .images import to_comfy_images
from .loader import PIPELINE

CODES = "SSD_CODES"

LEGEND = "\n".join(legend_lines())  # the demo's legend: one palette for every face of the library


@dataclass(frozen=True)
class SSDCodes:
    """What SSD Generate hands on: the code grid, the round each cell became final in, the image size, and the
    decoding's last round, which the acceptance map needs to tell resamples never checked again."""

    codes: torch.Tensor  # [B, R, C] long; -1 where a cell was never decoded
    final_round: torch.Tensor  # [B, R, C] long; see ssd_pipelines.acceptance
    image_size: tuple[int, int]  # (H, W) of the images these codes decode to
    last_round: int | None  # the run's round_cap: ssd's verify_rounds, whose last resamples were never checked again


def acceptance_map(codes: SSDCodes) -> torch.Tensor:
    """Per-cell categories -> ComfyUI IMAGE [B, H, W, 3], each cell a flat block of its category's colour."""
    cells = torch.from_numpy(cell_colours(codes.final_round, codes.last_round)).float() / 255.0  # [B, R, C, 3]
    pixels = F.interpolate(cells.permute(0, 3, 1, 2), size=codes.image_size, mode="nearest")  # [B, 3, H, W]
    return pixels.permute(0, 2, 3, 1).contiguous()


class SSDDecodeCodes:
    DESCRIPTION = "Turns SSD codes back into images with the pipeline's VQ decoder (cells never decoded are black)."
    CATEGORY = "SSD"
    FUNCTION = "decode"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    OUTPUT_TOOLTIPS = ("The decoded images [B, H, W, 3], values in 0..1.",)

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "pipeline": (PIPELINE, {"tooltip": "The pipeline whose VQ decoder made these codes."}),
                "codes": (CODES, {"tooltip": "Codes from SSD Generate."}),
            }
        }

    def decode(self, pipeline: SSDAutoregressivePipeline, codes: SSDCodes) -> tuple[torch.Tensor]:
        return (to_comfy_images(pipeline.decode_codes(codes.codes, output_type="np")),)


class SSDAcceptanceMap:
    DESCRIPTION = "Colours each cell of the code grid by how it became final, as the demo does.\n" + LEGEND
    CATEGORY = "SSD"
    FUNCTION = "draw"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("map",)
    OUTPUT_TOOLTIPS = ("One map per image, the images' size, each cell a flat colour (legend in the description).",)

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"codes": (CODES, {"tooltip": "Codes from SSD Generate (they carry each cell's round)."})}}

    def draw(self, codes: SSDCodes) -> tuple[torch.Tensor]:
        return (acceptance_map(codes),)
