"""The demo's pictures and tables: the legend, preview tiles, PNG files, acceptance per round, statistics."""

import numpy as np
import PIL.Image

from app import render
from ssd_pipelines.acceptance import CATEGORIES

SSD = {
    "strategy": "ssd",
    "forward_passes": 36,
    "seconds": 0.5,
    "rows_completed": 16,
    "acceptance_per_round": [0.25],
    "drafted_per_round": [240],
}
AR = {**SSD, "strategy": "ar", "forward_passes": 256, "seconds": 2.0, "acceptance_per_round": []}


def test_the_legend_is_the_librarys_palette():
    legend = render.legend_html()
    assert legend.count("<li>") == len(CATEGORIES) == 5
    assert all(f"<b>{c.label}</b>: {c.meaning}" in legend and f"rgb{c.colour}" in legend for c in CATEGORIES)
    assert "<b>from the model</b>" in legend and "<b>exact</b>" not in legend


def test_a_batch_is_tiled_in_a_near_square_grid_with_sharp_cells():
    red = PIL.Image.new("RGB", (4, 4), "red")
    blue = PIL.Image.new("RGB", (4, 4), "blue")
    tiled = render.tile([red, blue], scale=3, gap=2)
    assert tiled.size == (12 + 2 + 12, 12)
    pixels = np.asarray(tiled)
    assert (pixels[:, :12] == (255, 0, 0)).all() and (pixels[:, 14:] == (0, 0, 255)).all()
    assert (pixels[:, 12:14] == 255).all()  # the white gap
    eight = render.tile([red] * 7 + [blue], scale=3, gap=2)  # 3 columns, 3 rows, the last row short
    assert eight.size == (3 * 12 + 2 * 2, 3 * 12 + 2 * 2)
    pixels = np.asarray(eight)
    assert (pixels[28:, 14:26] == (0, 0, 255)).all() and (pixels[28:, 28:] == 255).all()


def test_a_png_file_is_named_by_its_content_and_written_once(tmp_path):
    image = PIL.Image.new("RGB", (4, 4), "green")
    path = render.png_file(image, tmp_path)
    written = (tmp_path / path).stat().st_mtime_ns
    assert render.png_file(image.copy(), tmp_path) == path  # the same picture again: the same file, not rewritten
    assert (tmp_path / path).stat().st_mtime_ns == written
    assert render.png_file(PIL.Image.new("RGB", (4, 4), "red"), tmp_path) != path
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".png", ".png"]  # no staging file left over
    assert PIL.Image.open(path).format == "PNG" and np.array_equal(np.asarray(PIL.Image.open(path)), np.asarray(image))


def test_rounds_are_ordered_as_numbers_not_as_text():
    stats = {**SSD, "acceptance_per_round": [0.5] * 11 + [None], "drafted_per_round": [9] * 12}
    table = render.acceptance_table(stats)
    assert render.round_order(stats) == [str(k) for k in range(1, 13)] == table["round"].tolist()
    assert render.acceptance_table(SSD).to_dict("list") == {"round": ["1"], "accepted": [0.25], "drafted cells": [240]}


def test_statistics_and_speedup_come_from_the_runs():
    table = render.stats_markdown({"ssd": SSD, "ar": AR})
    assert "| forward passes | 36 | 256 |" in table and "| acceptance per round | 0.25 | - |" in table
    speedup = render.speedup_markdown(SSD, AR)
    assert "**ssd in this run: 7.1x fewer forward passes and 4.0x faster than ar** (same prompt and seed)." in speedup
    assert speedup.endswith(
        "ssd is lossy: its distribution is close to ar's, not equal to it, and the pictures differ."
    )


def test_an_exact_comparison_says_same_distribution_different_sample():
    exact = {**SSD, "strategy": "exact"}
    assert "exact is lossless: the same distribution as ar, a different sample of it" in render.speedup_markdown(
        exact, AR
    )
