"""The tiny GLM-Image (`ssd_pipelines.tiny_glm_image`) saved as a Hub snapshot and run by the stock
`diffusers.GlmImagePipeline`, reloaded with the network shut off."""

from __future__ import annotations

import json
import math
import socket

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from diffusers import GlmImagePipeline
from PIL import Image

from ssd_pipelines.tiny_glm_image import (
    CODEBOOK_SIZE,
    condition_tokens_patch,
    dit_token,
    save_tiny_glm_image,
    tiny_glm_image_pipeline,
)

HEIGHT, WIDTH = 32, 64  # one 32 px code row of two, so a swapped height and width shows
PROMPT = "a red cat in the rain"


def _offline(patch: pytest.MonkeyPatch) -> None:
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setenv("TRANSFORMERS_OFFLINE", "1")
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise OSError("the network is shut off in this test")

    patch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return save_tiny_glm_image(tmp_path_factory.mktemp("hub") / "GLM-Image", seed=0)


@pytest.fixture(scope="module")
def reloaded(snapshot):
    with pytest.MonkeyPatch.context() as patch:
        _offline(patch)
        pipe = GlmImagePipeline.from_pretrained(snapshot)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def offline(monkeypatch):
    _offline(monkeypatch)


def _t2i_inputs(processor, height=HEIGHT, width=WIDTH):
    """The AR inputs as `GlmImagePipeline.generate_prior_tokens` builds them for one prompt."""
    messages = [[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]]
    return processor.apply_chat_template(
        messages, tokenize=True, padding=False, target_h=height, target_w=width, return_dict=True, return_tensors="pt"
    )


def test_snapshot_layout(snapshot):
    index = json.loads((snapshot / "model_index.json").read_text())
    assert index["_class_name"] == "GlmImagePipeline"
    components = {
        "processor",
        "scheduler",
        "text_encoder",
        "tokenizer",
        "transformer",
        "vae",
        "vision_language_encoder",
    }
    assert components <= set(index) and all((snapshot / name).is_dir() for name in components)
    assert (snapshot / "vision_language_encoder" / "generation_config.json").is_file()


def test_processor_writes_the_prompt_then_both_grids(reloaded):
    inputs = _t2i_inputs(reloaded.processor)
    tokens = reloaded.processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    grids = ["<sop>", "1", "2", "<eop>", "<sop>", "1", "1", "2", "2", "<eop>", dit_token(CODEBOOK_SIZE)]
    assert tokens == PROMPT.split() + grids
    assert inputs["image_grid_thw"].tolist() == [[1, 1, 2], [1, 11, 22]]  # the large grid, then the preview
    assert inputs["images_per_sample"].tolist() == [2]


def test_text_to_image_runs_offline_from_the_snapshot(reloaded, offline):
    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        return reloaded(PROMPT, height=HEIGHT, width=WIDTH, num_inference_steps=2, generator=generator).images[0]

    image = run(0)
    assert isinstance(image, Image.Image) and image.size == (WIDTH, HEIGHT)
    assert np.array_equal(np.asarray(image), np.asarray(run(0)))  # the AR is seeded from generator.initial_seed()


def test_reloaded_ar_model_decodes_as_the_built_one(reloaded, offline):
    built = tiny_glm_image_pipeline(seed=0).vision_language_encoder
    inputs = _t2i_inputs(reloaded.processor)
    max_new_tokens, large_offset, token_h, token_w = GlmImagePipeline._compute_generation_params(
        inputs["image_grid_thw"], is_text_to_image=True
    )
    preview = (int(math.sqrt(0.5) * 16), int(math.sqrt(2) * 16))
    assert (token_h, token_w) == (HEIGHT // 32, WIDTH // 32) and preview == (11, 22)
    assert max_new_tokens == token_h * token_w + preview[0] * preview[1] + 1 and large_offset == 242

    def decode(model):
        return model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True, output_logits=True
        )

    ours, theirs = decode(built), decode(reloaded.vision_language_encoder)
    new = ours.sequences[0, inputs["input_ids"].shape[1] :]
    assert new.numel() == max_new_tokens and bool((new < CODEBOOK_SIZE).all())
    assert torch.equal(ours.sequences, theirs.sequences)
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(theirs.logits))


def _condition_image():
    return Image.fromarray((np.random.RandomState(0).rand(64, 96, 3) * 255).astype(np.uint8))


def test_image_to_image_stock_pipeline_fails_on_condition_tokens(reloaded, offline):
    """At any model size: `generate_prior_tokens` concatenates the per-image (C, h, w) features transformers'
    `get_image_features` returns, and `get_image_tokens` then iterates over the channels, handing the VQ model's
    1x1 conv (h, w) maps of one channel (diffusers 0.42 with transformers 5.25)."""
    with pytest.raises(RuntimeError, match=r"expected input\[1, 1, 2, 3\] to have 32 channels"):
        reloaded(PROMPT, image=[_condition_image()], height=64, width=64, num_inference_steps=2)


def test_image_to_image_with_condition_tokens_patch(reloaded, offline, monkeypatch):
    model = reloaded.vision_language_encoder
    monkeypatch.setattr(model, "get_image_tokens", condition_tokens_patch(model))
    condition = _condition_image()  # 64 x 96 px: a 2 x 3 code grid, 4 x 6 once upsampled for the DiT
    generator = torch.Generator().manual_seed(0)
    prior, condition_prior, condition_grid = reloaded.generate_prior_tokens(
        PROMPT, height=64, width=64, image=[[condition]], device=torch.device("cpu"), generator=generator
    )
    assert prior.shape == (1, 16) and condition_prior[0].shape == (24,)
    assert condition_grid[0].tolist() == [[1, 4, 6]]
    image = reloaded(PROMPT, image=[condition], height=64, width=64, num_inference_steps=2, generator=generator)
    assert image.images[0].size == (64, 64)
