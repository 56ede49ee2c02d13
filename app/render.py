"""Pictures and tables of a run: previews, acceptance maps and their legend, acceptance per round, statistics.

Pure functions of the pipeline's outputs, so they are tested without a server.
Images of the reference model are 64 px; they are enlarged with nearest-neighbour
sampling so that each code cell stays a sharp square. The acceptance map, its
categories and colours are the library's (`ssd_pipelines.acceptance`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import tempfile
from pathlib import Path

import pandas as pd
import PIL.Image

from ssd_pipelines.acceptance import CATEGORIES, format_rates
from ssd_pipelines.decoding import decoding_label, strategy_class
from ssd_pipelines.speedup import against_ar


def legend_html() -> str:
    """A swatch and a sentence per category of the library's acceptance map."""
    items = "".join(
        f'<li><span class="swatch" style="background: rgb{c.colour}"></span><b>{c.label}</b>: {c.meaning}</li>'
        for c in CATEGORIES
    )
    return f'<ul class="legend">{items}</ul>'


def enlarge(image: PIL.Image.Image, scale: int) -> PIL.Image.Image:
    return image.resize((image.width * scale, image.height * scale), PIL.Image.Resampling.NEAREST)


def tile(images: list[PIL.Image.Image], scale: int = 4, gap: int = 8) -> PIL.Image.Image:
    """Images enlarged, on white, in a near-square grid (ceil(sqrt(n)) columns): one picture for the live
    preview of a batch that stays legible in a square box (8 images in a row were 40 px each)."""
    tiles = [enlarge(image.convert("RGB"), scale) for image in images]
    columns = math.ceil(math.sqrt(len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    width, height = tiles[0].size
    canvas = PIL.Image.new("RGB", (columns * width + gap * (columns - 1), rows * height + gap * (rows - 1)), "white")
    for i, t in enumerate(tiles):
        canvas.paste(t, ((i % columns) * (width + gap), (i // columns) * (height + gap)))
    return canvas


def png_file(image: PIL.Image.Image, folder: Path) -> str:
    """The image as a PNG named by its content, written under a temporary name and renamed into place.

    Why: Gradio rewrites a PIL image's cache file in place each time the same picture is sent again (the final
    preview equals the last streamed one). A browser fetching it meanwhile got a short file ("Too much data for
    declared Content-Length") and the preview collapsed to a 20 px strip. A path is copied into the cache once."""
    buffer = io.BytesIO()
    image.save(buffer, format="png")
    data = buffer.getvalue()
    path = folder / f"{hashlib.sha256(data).hexdigest()}.png"
    if not path.exists():
        fd, staging = tempfile.mkstemp(dir=folder, prefix=".", suffix=".png")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(staging, path)
    return str(path)


def acceptance_table(stats: dict) -> pd.DataFrame:
    """Share of drafted cells accepted in each verification round, for the bar plot. Rounds are short labels
    ("1", "2", ... "12": `exact` may take a dozen) that the plot orders by `round_order`, not as text."""
    rates = stats["acceptance_per_round"]
    return pd.DataFrame({"round": round_order(stats), "accepted": rates, "drafted cells": stats["drafted_per_round"]})


def round_order(stats: dict) -> list[str]:
    """The rounds' labels in the order they ran."""
    return [str(k) for k in range(1, len(stats["acceptance_per_round"]) + 1)]


def stats_markdown(runs: dict[str, dict]) -> str:
    """A table of the runs' statistics, one column per decoding."""
    names = list(runs)
    lines = ["| | " + " | ".join(f"**{n}**" for n in names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label: str, cell) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(runs[n]) for n in names) + " |")

    row("forward passes", lambda s: str(s["forward_passes"]))
    row("seconds", lambda s: f"{s['seconds']:.2f}")
    row("rows decoded", lambda s: f"{s['rows_completed']}")
    row("acceptance per round", lambda s: format_rates(s["acceptance_per_round"]))
    return "\n".join(lines)


def speedup_markdown(fast: dict, baseline: dict) -> str:
    """The speedup, and why the two pictures differ although prompt and seed are the same."""
    name = decoding_label(fast)
    why = (
        f"{name} is lossless: the same distribution as ar, a different sample of it, so the pictures differ as two "
        "seeds of ar would."
        if strategy_class(fast["strategy"]).lossless
        else f"{name} is lossy: its distribution is close to ar's, not equal to it, and the pictures differ."
    )
    return f"**{name} in this run: {against_ar(fast, baseline)}** (same prompt and seed). {why}"
