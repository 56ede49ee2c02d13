"""The library's acceptance map (ssd_pipelines.acceptance), which the demo, the ComfyUI nodes and the CLI share."""

import numpy as np
import PIL.Image
import torch

from ssd_pipelines import acceptance
from ssd_pipelines.acceptance import CATEGORIES, DRAFT_KEPT, FIXED_THEN_KEPT, FROM_MODEL, LAST_ROUND, NOT_DECODED, TINT


def test_each_cell_gets_the_category_of_the_round_it_became_final_in():
    rounds = torch.tensor([[-1, 0, 1, 2, 3]])
    with_last = [CATEGORIES[i] for i in acceptance.category_index(rounds, last_round=2)[0]]
    assert with_last == [NOT_DECODED, FROM_MODEL, DRAFT_KEPT, FIXED_THEN_KEPT, LAST_ROUND]
    uncapped = [CATEGORIES[i] for i in acceptance.category_index(rounds, last_round=None)[0]]  # exact
    assert uncapped == [NOT_DECODED, FROM_MODEL, DRAFT_KEPT, FIXED_THEN_KEPT, FIXED_THEN_KEPT]
    unverified = [CATEGORIES[i] for i in acceptance.category_index(rounds[:, :3], last_round=0)[0]]
    assert unverified == [NOT_DECODED, FROM_MODEL, DRAFT_KEPT]


def test_the_map_tints_each_code_cell_of_the_image_with_its_category():
    image = PIL.Image.new("RGB", (8, 4), (100, 50, 200))  # a 2 x 4 grid of 2 px cells
    rounds = torch.tensor([[0, 1, 2, -1], [1, 1, 3, 3]])
    tinted = np.asarray(acceptance.acceptance_map(image, rounds, last_round=2)).astype(float)
    assert tinted.shape == (4, 8, 3)
    cells = {(0, 0): FROM_MODEL, (0, 1): DRAFT_KEPT, (0, 2): FIXED_THEN_KEPT, (1, 3): LAST_ROUND}
    for (row, col), category in cells.items():
        expected = np.round((1 - TINT) * np.array([100, 50, 200]) + TINT * np.array(category.colour))
        cell = tinted[2 * row : 2 * row + 2, 2 * col : 2 * col + 2]
        assert (cell == expected).all(), (row, col)


def test_the_cells_of_the_models_own_distribution_are_not_named_after_the_exact_decoding():
    assert FROM_MODEL.label == "from the model"
    assert not any(c.label == "exact" for c in CATEGORIES)
