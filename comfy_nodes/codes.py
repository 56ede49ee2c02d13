"""The SSD_CODES type and the two nodes that read it: SSD Decode Codes and SSD Acceptance Map.

Codes are not a LATENT: LATENT nodes expect a float tensor [B, C, H, W] to sample or VAE-decode, and a grid of
VQ code indices means nothing to them. A custom type keeps them from being wired to those nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ssd_pipelines import SSDAutoregressivePipeline

from .images import to_comfy_images
from .loader import PIPELINE

CODES = "SSD_CODES"

# final_round (see the library's output) -> colour, and the legend line that names it.
# Rounds past the last entry share its colour.
ROUND_COLOURS: dict[int, tuple[tuple[float, float, float], str]] = {
    -1: ((0.0, 0.0, 0.0), "black: not decoded (the call was interrupted)"),
    0: ((0.20, 0.40, 0.95), "blue: sampled from the backbone itself (every ar cell; the first cell of each ssd block)"),
    1: ((0.20, 0.80, 0.30), "green: the drafting head's draft, kept (accepted in every verification round it saw)"),
    2: ((0.98, 0.85, 0.15), "yellow: resampled in verification round 1, kept since"),
    3: ((0.98, 0.50, 0.10), "orange: resampled in round 2"),
    4: ((0.90, 0.15, 0.15), "red: resampled in round 3"),
    5: ((0.75, 0.20, 0.85), "purple: resampled in round 4 or later (exact decoding runs rounds until nothing changes)"),
}
LEGEND = "\n".join(line for _colour, line in ROUND_COLOURS.values())


@dataclass(frozen=True)
class SSDCodes:
    """What SSD Generate hands on: the code grid, the round each cell became final in, and the image size."""

    codes: torch.Tensor  # [B, R, C] long; -1 where a cell was never decoded
    final_round: torch.Tensor  # [B, R, C] long; keys of ROUND_COLOURS
    image_size: tuple[int, int]  # (H, W) of the images these codes decode to


def acceptance_map(final_round: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Per-cell rounds [B, R, C] -> ComfyUI IMAGE [B, H, W, 3], each cell a flat block of its round's colour."""
    lowest, highest = min(ROUND_COLOURS), max(ROUND_COLOURS)
    palette = torch.tensor([colour for colour, _line in ROUND_COLOURS.values()], dtype=torch.float32)
    cells = palette[final_round.cpu().clamp(lowest, highest) - lowest]  # [B, R, C, 3]
    pixels = F.interpolate(cells.permute(0, 3, 1, 2), size=image_size, mode="nearest")  # [B, 3, H, W]
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
    DESCRIPTION = "Colours each cell of the code grid by the round in which it became final.\n" + LEGEND
    CATEGORY = "SSD"
    FUNCTION = "draw"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("map",)
    OUTPUT_TOOLTIPS = ("One map per image, the images' size, each cell a flat colour (legend in the description).",)

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"codes": (CODES, {"tooltip": "Codes from SSD Generate (they carry each cell's round)."})}}

    def draw(self, codes: SSDCodes) -> tuple[torch.Tensor]:
        return (acceptance_map(codes.final_round, codes.image_size),)
