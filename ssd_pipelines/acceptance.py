"""How a run's cells became final, for people: the acceptance map's categories and colours, and rates as text.

One palette and one legend for every face (the demo, the ComfyUI nodes, the
CLI), read from the pipeline's `final_round` (docs/decoding.md): 0 drawn from
the model's own distribution, 1 the head's draft kept, k >= 2 resampled in the
(k - 1)-th verification, -1 never decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch


@dataclass(frozen=True)
class Category:
    label: str
    colour: tuple[int, int, int]  # RGB, 0..255
    meaning: str


# "from the model", not "exact": the cells are the model's own samples in every decoding, `exact` or not.
FROM_MODEL = Category("from the model", (148, 163, 184), "sampled from the model's own distribution, as ar does")
DRAFT_KEPT = Category("draft kept", (22, 163, 74), "the drafting head's guess, accepted by every check")
FIXED_THEN_KEPT = Category(
    "fixed, then kept", (245, 158, 11), "rejected, resampled, and the resample accepted by a later check"
)
LAST_ROUND = Category(
    "resampled in the last round", (220, 38, 38), "rejected in ssd's last round and resampled, never checked again"
)
NOT_DECODED = Category("not decoded", (30, 30, 30), "the run stopped before this cell")
CATEGORIES = (FROM_MODEL, DRAFT_KEPT, FIXED_THEN_KEPT, LAST_ROUND, NOT_DECODED)

TINT = 0.5  # weight of the category colour over the image in a tinted map


def category_index(final_round: torch.Tensor | np.ndarray, last_round: int | None) -> np.ndarray:
    """Per-cell index into CATEGORIES, same shape as `final_round`.

    last_round: the cap on rounds (`ssd`'s verify_rounds), so that a cell resampled in it, never checked again,
    shows as such. None where rounds go on until nothing changes (`exact`): every resample was checked."""
    rounds = np.asarray(final_round.cpu() if isinstance(final_round, torch.Tensor) else final_round)
    index = np.full(rounds.shape, CATEGORIES.index(FIXED_THEN_KEPT), dtype=np.int64)
    index[rounds == -1] = CATEGORIES.index(NOT_DECODED)
    index[rounds == 0] = CATEGORIES.index(FROM_MODEL)
    index[rounds == 1] = CATEGORIES.index(DRAFT_KEPT)
    if last_round is not None and last_round >= 1:
        index[rounds == last_round + 1] = CATEGORIES.index(LAST_ROUND)
    return index


def cell_colours(final_round: torch.Tensor | np.ndarray, last_round: int | None) -> np.ndarray:
    """Each cell's category colour: [..., R, C] -> uint8 [..., R, C, 3]."""
    palette = np.array([c.colour for c in CATEGORIES], dtype=np.uint8)
    return palette[category_index(final_round, last_round)]


def acceptance_map(image: PIL.Image.Image, final_round: torch.Tensor, last_round: int | None) -> PIL.Image.Image:
    """The image with each code cell tinted by its category. final_round: [R, C]."""
    colours = cell_colours(final_round, last_round).astype(np.float32)  # [R, C, 3]
    rows, cols = colours.shape[:2]
    cells = np.repeat(np.repeat(colours, image.height // rows, axis=0), image.width // cols, axis=1)  # [H, W, 3]
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    return PIL.Image.fromarray(((1 - TINT) * pixels + TINT * cells).round().astype(np.uint8))


def legend_lines() -> list[str]:
    """One line per category: "label: meaning"."""
    return [f"{c.label}: {c.meaning}" for c in CATEGORIES]


def format_rates(rates: list[float | None]) -> str:
    """Acceptance per round as "0.31, 0.53"; "-" for a round that verified no drafted cell, or for no rounds."""
    return ", ".join("-" if r is None else f"{r:.2f}" for r in rates) or "-"
