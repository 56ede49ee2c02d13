"""Pictures and tables of a run: previews, acceptance maps and their legend, acceptance per round, statistics.

Pure functions of the pipeline's outputs, so they are tested without a server.
Images of the reference model are 64 px; they are enlarged with nearest-neighbour
sampling so that each code cell stays a sharp square.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import PIL.Image
import torch


@dataclass(frozen=True)
class Category:
    label: str
    colour: tuple[int, int, int]
    meaning: str


NOT_DECODED = Category("not decoded", (30, 30, 30), "the run stopped before this cell")
EXACT = Category("exact", (148, 163, 184), "sampled from the model's own distribution, as AR does")
FIRST_ROUND = Category("draft kept", (22, 163, 74), "the drafting head's guess, accepted in every round")
LATER_ROUND = Category("fixed in a round, then kept", (245, 158, 11), "rejected, resampled, and the resample accepted")
LAST_ROUND = Category("resampled in the last round", (220, 38, 38), "rejected in the last round and resampled")
CATEGORIES = (EXACT, FIRST_ROUND, LATER_ROUND, LAST_ROUND, NOT_DECODED)

TINT = 0.5  # weight of the category colour over the image in an acceptance map


def category_index(final_round: torch.Tensor | np.ndarray, last_round: int | None) -> np.ndarray:
    """Per-cell index into CATEGORIES from the pipeline's `final_round` (-1, 0, 1, or k >= 2: resampled in round
    k - 1). `last_round` is the cap on rounds (`ssd`'s verify_rounds): a cell resampled in it was never checked
    again. None without a cap (`exact`): rounds go on until one rejects nothing, so every resample was checked."""
    rounds = np.asarray(final_round)
    index = np.full(rounds.shape, CATEGORIES.index(LATER_ROUND), dtype=np.int64)
    index[rounds == -1] = CATEGORIES.index(NOT_DECODED)
    index[rounds == 0] = CATEGORIES.index(EXACT)
    index[rounds == 1] = CATEGORIES.index(FIRST_ROUND)
    if last_round is not None and last_round >= 1:
        index[rounds == last_round + 1] = CATEGORIES.index(LAST_ROUND)
    return index


def acceptance_map(image: PIL.Image.Image, final_round: torch.Tensor, last_round: int | None) -> PIL.Image.Image:
    """The image with each code cell tinted by the round in which it became final. final_round: [R, C]."""
    palette = np.array([c.colour for c in CATEGORIES], dtype=np.float32)
    colours = palette[category_index(final_round, last_round)]  # [R, C, 3]
    rows, cols = colours.shape[:2]
    cells = np.repeat(np.repeat(colours, image.height // rows, axis=0), image.width // cols, axis=1)  # [H, W, 3]
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    return PIL.Image.fromarray(((1 - TINT) * pixels + TINT * cells).round().astype(np.uint8))


def legend_html() -> str:
    """A swatch and a sentence per category of the acceptance map."""
    items = "".join(
        f'<li><span class="swatch" style="background: rgb{c.colour}"></span><b>{c.label}</b>: {c.meaning}</li>'
        for c in CATEGORIES
    )
    return f'<ul class="legend">{items}</ul>'


def enlarge(image: PIL.Image.Image, scale: int) -> PIL.Image.Image:
    return image.resize((image.width * scale, image.height * scale), PIL.Image.Resampling.NEAREST)


def tile(images: list[PIL.Image.Image], scale: int = 4, gap: int = 8) -> PIL.Image.Image:
    """Images side by side, enlarged, on white: one picture for the live preview of a batch."""
    tiles = [enlarge(image.convert("RGB"), scale) for image in images]
    width = sum(t.width for t in tiles) + gap * (len(tiles) - 1)
    canvas = PIL.Image.new("RGB", (width, max(t.height for t in tiles)), "white")
    x = 0
    for t in tiles:
        canvas.paste(t, (x, 0))
        x += t.width + gap
    return canvas


def acceptance_table(stats: dict) -> pd.DataFrame:
    """Share of drafted cells accepted in each verification round, for the bar plot."""
    rates = stats["acceptance_per_round"]
    return pd.DataFrame(
        {
            "round": [f"round {k}" for k in range(1, len(rates) + 1)],
            "accepted": rates,
            "drafted cells": stats["drafted_per_round"],
        }
    )


def stats_markdown(runs: dict[str, dict]) -> str:
    """A table of the runs' statistics, one column per decoding."""
    names = list(runs)
    lines = ["| | " + " | ".join(f"**{n}**" for n in names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label: str, cell) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(runs[n]) for n in names) + " |")

    row("forward passes", lambda s: str(s["forward_passes"]))
    row("seconds", lambda s: f"{s['seconds']:.2f}")
    row("rows decoded", lambda s: f"{s['rows_completed']}")
    row("acceptance per round", lambda s: ", ".join(f"{a:.2f}" for a in s["acceptance_per_round"]) or "-")
    return "\n".join(lines)


def speedup_markdown(fast: dict, baseline: dict) -> str:
    passes = baseline["forward_passes"] / fast["forward_passes"]
    seconds = baseline["seconds"] / fast["seconds"]
    return (
        f"**Speedup of {fast['strategy']} over ar in this run: {passes:.1f}x fewer forward passes, "
        f"{seconds:.1f}x less time** (same prompt and seed)."
    )
