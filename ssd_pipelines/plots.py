"""Pictures of results: the labelled image grid, and matplotlib's pyplot for figures (the optional `[bench]` extra,
imported only when a figure is drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def pyplot():
    """matplotlib's pyplot on the file-only backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - the message is the point
        raise SystemExit("the figures are drawn with matplotlib: pip install -e '.[bench]'") from error
    return plt


def image_grid(rows: dict[str, np.ndarray], captions: list[str], out: Path, scale: int = 2) -> None:
    """One row of images per strategy [n, H, W, 3], labelled; the columns' captions on top."""
    first = next(iter(rows.values()))
    n, h, w = first.shape[:3]
    cell_w, cell_h, label_w, head_h, gap = w * scale, h * scale, 130, 66, 4
    canvas = Image.new("RGB", (label_w + n * (cell_w + gap), head_h + len(rows) * (cell_h + gap)), "white")
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=13)
    for i, caption in enumerate(captions):
        x = label_w + i * (cell_w + gap)
        draw.multiline_text((x + 2, 2), _wrapped(draw, caption, font, cell_w, 4), fill="black", font=font, spacing=1)
    for r, (label, images) in enumerate(rows.items()):
        y = head_h + r * (cell_h + gap)
        text = _wrapped(draw, label, font, label_w - 8, 3)
        draw.multiline_text((4, y + cell_h // 2 - 8 * text.count("\n") - 6), text, fill="black", font=font, spacing=3)
        for i, image in enumerate(images):
            tile = Image.fromarray(image).resize((cell_w, cell_h), Image.NEAREST)
            canvas.paste(tile, (label_w + i * (cell_w + gap), y))
    canvas.save(out)


def _wrapped(draw: ImageDraw.ImageDraw, text: str, font, width: int, max_lines: int) -> str:
    """`text` broken between words into at most `max_lines` lines no wider than `width` pixels (where a word
    allows)."""
    lines = [""]
    for word in text.split():
        if lines[-1] and draw.textlength(f"{lines[-1]} {word}", font=font) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}".strip()
    return "\n".join(lines[:max_lines])
