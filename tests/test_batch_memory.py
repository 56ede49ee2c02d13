"""A batch that cannot fit in its device's free memory is refused before any work, with what it needs and the
largest batch that fits (ssd_pipelines.memory); it is never split behind the caller's back."""

import time
from pathlib import Path

import pytest
import torch

from ssd_pipelines import SSDAutoregressivePipeline, memory
from ssd_pipelines.testing import tiny_pipeline

REFERENCE = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


def cache_bytes(state) -> int:
    return sum(t.numel() * t.element_size() for layer in state.cache.layers for t in (layer.keys, layer.values))


def test_the_estimate_holds_the_whole_image_s_cache(pipe):
    """A lower bound that counts at least what the key/value cache of a whole image takes, prompt included."""
    backbone = pipe.image_backbone
    grid = backbone.grid
    batch = backbone.encode_prompts(["a red circle", "blue"], grid=grid)
    state, _ = backbone.prefill(batch)
    backbone.extend(state, torch.zeros(batch.batch_size, grid.sequence_length, backbone.embed_size))
    estimate = backbone.memory_per_row(batch.input_ids.shape[1], grid) * batch.batch_size
    assert cache_bytes(state) <= estimate <= 2 * cache_bytes(state)


def test_a_million_images_are_refused_at_once():
    """Issue 40: on the reference model, num_images_per_prompt=10**6 ran 85 s, until the out-of-memory killer ended
    the process at 24 GB; they need about 7 TB."""
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"^1000000 images need at least .* TB on cpu .* pass at most \d+ images"):
        pipe("a red circle", num_images_per_prompt=10**6, decoding="ar")
    assert time.perf_counter() - started < 5  # before 10**6 prompts are tokenized


def test_the_largest_batch_that_fits_is_named_and_runs(pipe, monkeypatch):
    backbone = pipe.image_backbone
    batch = backbone.encode_prompts(["a red circle"], guidance=True, grid=backbone.grid)
    per_image = 2 * backbone.memory_per_row(batch.input_ids.shape[1], backbone.grid)  # guided: two rows an image
    monkeypatch.setattr(memory, "free_bytes", lambda device: 3 * per_image + 1)
    with pytest.raises(ValueError) as refused:
        pipe("a red circle", num_images_per_prompt=4, guidance_scale=3.0, decoding="ar")
    assert str(refused.value) == (
        f"4 images need at least {memory._size(4 * per_image)} on cpu for their key/value cache and activations "
        f"({memory._size(per_image)} an image), and it has {memory._size(3 * per_image + 1)} free: pass at most 3 "
        "images a call (len(prompt) * num_images_per_prompt) and make several calls, with one generator per image "
        "so that each image's codes do not depend on the split."
    )
    out = pipe("a red circle", num_images_per_prompt=3, guidance_scale=3.0, decoding="ar", output_type="latent")
    assert out.codes.shape[0] == 3


def test_when_not_even_one_image_fits_it_says_what_to_free(pipe, monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 10)
    with pytest.raises(ValueError, match=r"free: free memory on it, or load the pipeline in a smaller dtype"):
        pipe("a red circle", decoding="ar")


def test_a_device_that_cannot_say_what_is_free_is_not_checked(pipe, monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: None)
    assert pipe("a red circle", decoding="ar", output_type="latent").codes.shape[0] == 1
