"""`SSDGlmImagePipeline` (issue 54, part 2): diffusers' GlmImagePipeline with its AR stage decoded by our engine, on
the tiny GLM-Image saved as a Hub snapshot and reloaded with the network shut off."""

from __future__ import annotations

import json
import shutil
import socket
import threading

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from diffusers import GlmImagePipeline
from PIL import Image
from transformers import GenerationConfig, TorchAoConfig

from ssd_pipelines import DraftHeads, SamplingConfig, SSDGlmImagePipeline
from ssd_pipelines.pipeline_glm_image import GENERATE_DEFAULTS
from ssd_pipelines.testing import tiny_heads
from ssd_pipelines.tiny_glm_image import save_tiny_glm_image

HEIGHT, WIDTH = 32, 64  # a 1 x 2 large grid after an 11 x 22 preview: 12 AR rows
PROMPT = "a red cat in the rain"
STEPS = 2
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise OSError("the network is shut off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return save_tiny_glm_image(tmp_path_factory.mktemp("hub") / "GLM-Image", seed=0)


def load(folder, **kwargs) -> SSDGlmImagePipeline:
    pipe = SSDGlmImagePipeline.from_pretrained(folder, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def pipe(snapshot):
    return load(snapshot)


@pytest.fixture
def with_heads(pipe):
    pipe.load_heads(tiny_heads(pipe.image_backbone))
    return pipe


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def generate(pipe, seed=0, **kwargs):
    options = {"height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS, "generator": seeded(seed), **kwargs}
    return pipe(PROMPT, **options)


@pytest.mark.parametrize("decoding", ["ar", "exact", "ssd"])
def test_every_decoding_makes_an_image_of_the_asked_size(with_heads, decoding):
    out = generate(with_heads, decoding=decoding, num_images_per_prompt=2)
    assert len(out.images) == 2 and all(isinstance(i, Image.Image) and i.size == (WIDTH, HEIGHT) for i in out.images)
    assert out.prior_token_ids.shape == (2, 2 * 4) and bool((out.prior_token_ids < 128).all())
    stats = out.stats
    assert stats["decoding"] == stats["chosen_decoding"] == decoding
    assert stats["preview"]["rows_completed"] == 11 and stats["large"]["rows_completed"] == 1
    assert stats["forward_passes"] == stats["preview"]["forward_passes"] + stats["large"]["forward_passes"]
    if decoding == "ar":
        assert stats["forward_passes"] == 11 * 22 + 2  # one pass a code, each prefill included


def test_the_default_decoding_is_exact_with_heads_and_ar_without(pipe):
    assert generate(pipe, output_type="latent").stats["decoding"] == "ar"
    pipe.load_heads(tiny_heads(pipe.image_backbone))
    assert generate(pipe, output_type="latent").stats["decoding"] == "exact"


def test_greedy_exact_writes_the_prior_tokens_of_greedy_ar(with_heads):
    """Both grids at a 2 x 3 large grid: `exact` is lossless, so greedy it is greedy `ar` token for token."""
    ar, exact = (
        with_heads.decode_prior([PROMPT, "the blue dog"], 64, 96, 1, None, decoding, GREEDY, {})
        for decoding in ("ar", "exact")
    )
    assert ar.preview.shape == (2, 13, 19) and ar.large.shape == (2, 2, 3)
    assert torch.equal(exact.preview, ar.preview) and torch.equal(exact.large, ar.large)
    assert torch.equal(exact.ids, ar.ids) and exact.stats["forward_passes"] < ar.stats["forward_passes"]


def test_the_prior_ids_are_the_large_grid_upsampled_as_the_stock_pipeline_does(pipe):
    prior = pipe.decode_prior([PROMPT], 64, 96, 1, seeded(0), "ar", pipe.ar_sampling(), {})
    assert torch.equal(prior.ids, GlmImagePipeline._upsample_token_ids(prior.large.flatten(), 2, 3))


def test_equal_prior_tokens_give_the_stock_pipelines_images(pipe, monkeypatch):
    """The DiT stage is the stock one, and the AR stage leaves the generator to it as the stock pipeline does."""
    ours = generate(pipe, decoding="ar", output_type="np")
    stock = GlmImagePipeline(**{name: c for name, c in pipe.components.items() if name != "heads"})
    stock.set_progress_bar_config(disable=True)
    monkeypatch.setattr(stock, "generate_prior_tokens", lambda **kwargs: (ours.prior_token_ids, None, None))
    theirs = generate(stock, output_type="np")
    assert np.array_equal(ours.images, theirs.images)


def test_a_call_leaves_torchs_global_generator_alone_and_a_seed_repeats(pipe):
    state = torch.get_rng_state()
    first = generate(pipe, seed=3, output_type="np")
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(generate(pipe, seed=3, output_type="np").images, first.images)
    assert not np.array_equal(generate(pipe, seed=4, output_type="np").images, first.images)


def test_each_image_comes_from_its_own_generator(pipe):
    """With a list, image i's prior tokens and latents come from generator i alone, not from its batch."""
    both = generate(pipe, generator=[seeded(1), seeded(2)], num_images_per_prompt=2, output_type="np")
    alone = generate(pipe, generator=[seeded(2)], output_type="np")
    assert torch.equal(both.prior_token_ids[1:], alone.prior_token_ids)
    np.testing.assert_allclose(both.images[1:], alone.images, atol=1e-5)
    with pytest.raises(ValueError, match=r"a list of 2 \(len\(prompt\) \* num_images_per_prompt = 1 \* 2\)"):
        generate(pipe, generator=[seeded(1)], num_images_per_prompt=2)


def test_save_and_reload_keeps_the_heads_and_the_images(with_heads, tmp_path):
    with_heads.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "model_index.json").read_text())["heads"] == ["ssd_pipelines", "DraftHeads"]
    reloaded = load(tmp_path / "saved")
    saved, loaded = with_heads.heads.state_dict(), reloaded.heads.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    before, after = (generate(p, output_type="np", decoding="exact") for p in (with_heads, reloaded))
    assert np.array_equal(before.images, after.images)
    assert torch.equal(before.prior_token_ids, after.prior_token_ids)


def test_from_pretrained_takes_heads_and_dtype(snapshot):
    heads = tiny_heads(load(snapshot).image_backbone)
    pipe = load(snapshot, heads=heads, dtype=torch.bfloat16)
    assert pipe.vision_language_encoder.dtype == pipe.heads.dtype == torch.bfloat16


def test_from_pipe_shares_the_components(snapshot):
    stock = GlmImagePipeline.from_pretrained(snapshot)
    heads = tiny_heads(load(snapshot).image_backbone)
    ours = SSDGlmImagePipeline.from_pipe(stock, heads=heads)
    assert all(ours.components[name] is component for name, component in stock.components.items())
    assert ours.heads is heads
    back = GlmImagePipeline.from_pipe(ours)  # what image to image is told to use
    assert back.vision_language_encoder is stock.vision_language_encoder


def test_quantization_config_quantizes_the_ar_model(snapshot):
    from torchao.quantization import Int8WeightOnlyConfig

    pipe = load(snapshot, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
    assert type(pipe.vision_language_encoder.model.language_model.layers[0].mlp.down_proj.weight).__name__ == (
        "Int8Tensor"
    )
    assert type(pipe.transformer.proj_out.weight) is torch.nn.Parameter  # the DiT stays as it was
    assert generate(pipe, output_type="latent").stats["forward_passes"] == 11 * 22 + 2


def test_sampling_reads_the_generation_config_then_generates_defaults(pipe):
    assert GENERATE_DEFAULTS.items() <= GenerationConfig._get_default_generation_params().items()
    assert pipe.ar_sampling() == SamplingConfig(temperature=0.9, top_k=50, top_p=0.75)  # top_k: generate's default
    assert pipe.ar_sampling(temperature=0, top_k=0, top_p=1.0) == SamplingConfig(temperature=0.0)


def test_progress_shows_the_ar_rows_then_the_dit_steps(pipe, capsys):
    pipe.set_progress_bar_config()
    generate(pipe, output_type="latent")
    shown = capsys.readouterr().err
    assert "prior tokens (rows): 100%" in shown and "12/12" in shown and f"{STEPS}/{STEPS}" in shown
    assert shown.index("12/12") < shown.index(f"{STEPS}/{STEPS}")
    pipe.set_progress_bar_config(disable=True)
    generate(pipe, output_type="latent")
    assert capsys.readouterr().err == ""


def test_the_interrupt_flag_is_per_thread(pipe):
    """Set from a callback, `_interrupt` stops the call of its own thread only, as in SSDAutoregressivePipeline."""
    other = threading.Thread(target=setattr, args=(pipe, "_interrupt", True))
    other.start()
    other.join()
    assert pipe.interrupt is False


def test_image_to_image_is_refused_with_what_to_use(pipe):
    condition = Image.new("RGB", (64, 64))
    with pytest.raises(
        ValueError, match=r"image to image is not supported by SSDGlmImagePipeline yet.*GlmImagePipeline"
    ):
        generate(pipe, image=[condition])


def test_sizes_that_are_not_multiples_of_32_are_refused(pipe):
    with pytest.raises(
        ValueError, match=r"multiples of 32 px .* got 48x64: pass height and width that are, e\.g\. 32x64"
    ):
        generate(pipe, height=48)


def test_decodings_that_draft_need_heads(pipe):
    with pytest.raises(ValueError, match=r"decoding='ssd' drafts with drafting heads and this pipeline has none: pass"):
        generate(pipe, decoding="ssd")
    with pytest.raises(ValueError, match=r"verify_rounds applies to decoding='ssd' only, not 'ar'"):
        generate(pipe, decoding="ar", verify_rounds=1)


def test_heads_of_another_backbone_are_refused(pipe):
    other = DraftHeads(hidden_size=48, embed_size=48, codebook_size=128, horizontal_offsets=(1,), vertical_offsets=(1,))
    with pytest.raises(ValueError, match=r"These drafting heads do not fit this backbone: .*\(48, 48, 128\)"):
        pipe.load_heads(other)


def test_a_folder_without_the_ar_model_is_refused_with_what_to_do(snapshot, tmp_path):
    folder = shutil.copytree(snapshot, tmp_path / "no-ar")
    shutil.rmtree(folder / "vision_language_encoder")
    index = json.loads((folder / "model_index.json").read_text())
    del index["vision_language_encoder"]
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"has no 'vision_language_encoder' .* Load a complete GLM-Image pipeline"):
        SSDGlmImagePipeline.from_pretrained(folder)


def test_a_folder_naming_its_own_module_is_refused_before_anything_is_imported(snapshot, tmp_path):
    """Issue 56's rule for this loader too: model_index.json names the classes, and they load only from
    ssd_pipelines, transformers and diffusers; a module planted in the folder is never run."""
    folder = tmp_path / "evil"
    shutil.copytree(snapshot, folder)
    (folder / "evil").mkdir()
    (folder / "evil" / "__init__.py").write_text("import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n")
    index = json.loads((folder / "model_index.json").read_text())
    index["transformer"] = ["evil", "Transformer"]
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names the module 'evil' for 'transformer', and components load only from"):
        SSDGlmImagePipeline.from_pretrained(folder)
    assert not (folder / "evil" / "ran").exists()
