"""What GET /info says of a served pipeline: its model, image sizes, decodings with their options and defaults,
the limits of a request and the server's settings."""

from __future__ import annotations

from ..backbones.base import ImageBackbone
from ..decoding import DEFAULT_DECODING, STRATEGIES, USER_DECODINGS
from .request import GenerateRequest


def describe(pipe, model: str, serving: dict, limits: dict) -> dict:
    backbone = pipe.image_backbone
    (height, width), grid = backbone.image_size, backbone.grid
    fixed = type(backbone).grid_for_size is ImageBackbone.grid_for_size  # the base class makes one size only
    return {
        "model": model,
        "image_size": {"height": height, "width": width},
        # one size, or other sizes too: then POST /generate says which a height and width do not make
        "image_sizes": [{"height": height, "width": width}] if fixed else None,
        "grid": {"rows": grid.rows, "cols": grid.cols, "codebook_size": grid.codebook_size},
        "default_guidance_scale": backbone.default_guidance_scale,
        "default_decoding": DEFAULT_DECODING,
        "user_decodings": list(USER_DECODINGS),
        "decodings": {name: _decoding(cls, pipe) for name, cls in STRATEGIES.items()},
        "request_fields": list(GenerateRequest.model_fields),
        "limits": limits,
        "serving": serving,
    }


def _decoding(cls, pipe) -> dict:
    return {
        "summary": cls.summary,
        "lossless": cls.lossless,
        "needs_heads": cls.needs_heads,
        "available": not cls.needs_heads or pipe.heads is not None,
        "options": {
            option.name: {"default": option.default, "minimum": option.minimum, "about": option.about}
            for option in cls.options
        },
    }
