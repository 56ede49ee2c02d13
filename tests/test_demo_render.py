"""The demo's pictures and tables: acceptance-map categories and colours, preview tiles, statistics."""

import numpy as np
import PIL.Image
import torch

from app import render
from app.render import CATEGORIES, EXACT, FIRST_ROUND, LAST_ROUND, LATER_ROUND, NOT_DECODED, TINT


def test_each_cell_gets_the_category_of_the_round_it_became_final_in():
    rounds = torch.tensor([[-1, 0, 1, 2, 3]])
    with_last = [CATEGORIES[i] for i in render.category_index(rounds, last_round=2)[0]]
    assert with_last == [NOT_DECODED, EXACT, FIRST_ROUND, LATER_ROUND, LAST_ROUND]
    uncapped = [CATEGORIES[i] for i in render.category_index(rounds, last_round=None)[0]]  # exact
    assert uncapped == [NOT_DECODED, EXACT, FIRST_ROUND, LATER_ROUND, LATER_ROUND]
    unverified = [CATEGORIES[i] for i in render.category_index(rounds[:, :3], last_round=0)[0]]
    assert unverified == [NOT_DECODED, EXACT, FIRST_ROUND]


def test_the_map_tints_each_code_cell_of_the_image_with_its_category():
    image = PIL.Image.new("RGB", (8, 4), (100, 50, 200))  # a 2 x 4 grid of 2 px cells
    rounds = torch.tensor([[0, 1, 2, -1], [1, 1, 3, 3]])
    tinted = np.asarray(render.acceptance_map(image, rounds, last_round=2)).astype(float)
    assert tinted.shape == (4, 8, 3)
    for (row, col), category in {(0, 0): EXACT, (0, 1): FIRST_ROUND, (0, 2): LATER_ROUND, (1, 3): LAST_ROUND}.items():
        expected = np.round((1 - TINT) * np.array([100, 50, 200]) + TINT * np.array(category.colour))
        cell = tinted[2 * row : 2 * row + 2, 2 * col : 2 * col + 2]
        assert (cell == expected).all(), (row, col)


def test_the_legend_names_every_category():
    legend = render.legend_html()
    assert all(c.label in legend and f"rgb{c.colour}" in legend for c in CATEGORIES)


def test_a_batch_is_tiled_side_by_side_with_sharp_cells():
    red = PIL.Image.new("RGB", (4, 4), "red")
    blue = PIL.Image.new("RGB", (4, 4), "blue")
    tiled = render.tile([red, blue], scale=3, gap=2)
    assert tiled.size == (12 + 2 + 12, 12)
    pixels = np.asarray(tiled)
    assert (pixels[:, :12] == (255, 0, 0)).all() and (pixels[:, 14:] == (0, 0, 255)).all()
    assert (pixels[:, 12:14] == 255).all()  # the white gap


def test_statistics_and_speedup_come_from_the_runs():
    ssd = {
        "strategy": "ssd",
        "forward_passes": 36,
        "seconds": 0.5,
        "rows_completed": 16,
        "acceptance_per_round": [0.25],
        "drafted_per_round": [240],
    }
    ar = {**ssd, "strategy": "ar", "forward_passes": 256, "seconds": 2.0, "acceptance_per_round": []}
    table = render.stats_markdown({"ssd": ssd, "ar": ar})
    assert "| forward passes | 36 | 256 |" in table and "| acceptance per round | 0.25 | - |" in table
    assert "7.1x fewer forward passes, 4.0x less time" in render.speedup_markdown(ssd, ar)
    plot = render.acceptance_table(ssd)
    assert plot.to_dict("list") == {"round": ["round 1"], "accepted": [0.25], "drafted cells": [240]}
