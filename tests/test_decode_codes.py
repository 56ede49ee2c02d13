"""`pipe.decode_codes` refuses what the VQ decoder would fail on deep inside torch, saying what to pass."""

import pytest
import torch

from ssd_pipelines.testing import tiny_pipeline

GOOD = torch.zeros(2, 4, 4, dtype=torch.long)  # the tiny pipeline's grid: 4 x 4 codes of a codebook of 8


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


@pytest.mark.parametrize(
    "codes, got",
    [
        (GOOD + 8, "values from 8 to 8"),  # an IndexError in the embedding of the VQ decoder
        (torch.where(GOOD.bool(), GOOD, -2), "values from -2 to -2"),  # drawn as code 0 while not decoded
        (GOOD.float(), "a tensor of torch.float32"),
        (GOOD.bool(), "a tensor of torch.bool"),
        (GOOD[0], "a tensor of shape [4, 4] (for one image, pass codes[None])"),
        (GOOD[:, None], "a tensor of shape [2, 1, 4, 4]"),
        (GOOD.tolist(), "a list"),
        (GOOD[:, :3], "a 3 x 4 grid"),
        (GOOD[:0], "no images (a batch of 0)"),  # diffusers' attention failed on it
        (
            GOOD.reshape(2, 16),
            "a tensor of shape [2, 16] (for flat codes of the default size, pass codes.reshape(-1, 4, 4))",
        ),
        (GOOD.reshape(32), "a tensor of shape [32] (for flat codes of the default size, pass codes.reshape(-1, 4, 4))"),
    ],
    ids=[
        "out-of-range",
        "below-minus-one",
        "float",
        "bool",
        "2-D",
        "4-D",
        "list",
        "other-grid",
        "empty",
        "flat",
        "1-D",
    ],
)
def test_codes_the_decoder_cannot_draw_say_what_to_pass(pipe, codes, got):
    with pytest.raises(ValueError) as caught:
        pipe.decode_codes(codes)
    assert str(caught.value) == (
        "`codes` must be an integer tensor [B, R, C] on a grid this model makes (4 x 4 at its default size), with "
        f"values in 0..7, or -1 where not decoded; got {got}. Pass the codes of a call with output_type='latent', "
        "or those callback_on_step_end receives."
    )


def test_every_code_and_minus_one_are_drawn(pipe):
    codes = torch.arange(32).reshape(2, 4, 4) % 9 - 1  # 0..7 and -1, each somewhere
    images = pipe.decode_codes(codes.int(), output_type="np")
    assert images.shape == (2, 16, 16, 3) and (images[0, :4, :4] == 0).all()  # cell (0, 0) is -1: black
