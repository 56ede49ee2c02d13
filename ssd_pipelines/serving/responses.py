"""A job's result as the HTTP API answers it: the PNG itself, or JSON with base64 PNGs, codes, stats and warnings."""

from __future__ import annotations

import base64
import io
import json

from .batching import Generated


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def as_json(result: Generated) -> dict:
    return {
        "images": [base64.b64encode(png_bytes(image)).decode("ascii") for image in result.images],
        "codes": result.codes.tolist(),
        "seeds": result.seeds,
        "stats": result.stats,
        "warnings": result.warnings,
    }


def png_headers(result: Generated) -> dict[str, str]:
    """What a PNG answer carries beside the image: stats and warnings as ASCII JSON (headers are latin-1)."""
    return {
        "X-SSD-Stats": json.dumps(result.stats, separators=(",", ":")),
        "X-SSD-Warnings": json.dumps(result.warnings, separators=(",", ":")),
        "X-SSD-Seeds": json.dumps(result.seeds),
    }
