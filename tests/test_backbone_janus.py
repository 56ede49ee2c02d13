"""Janus-Pro: our AR decoding against `JanusForConditionalGeneration.generate(generation_mode="image")`."""

import json

import pytest
import torch
from tiny_backbones import tiny_janus

from ssd_pipelines import ARDecoding, DraftHeads, SamplingConfig
from ssd_pipelines.backbones import JanusProBackbone
from ssd_pipelines.training.distill import main

PROMPTS = ["a red dog", "the blue cat in the rain"]  # different lengths: the batch is left-padded


@pytest.fixture(scope="module")
def janus():
    model, tokenizer = tiny_janus()
    return JanusProBackbone(model, tokenizer)


@pytest.mark.parametrize("guidance", [5.0, 2.0])
def test_greedy_ar_is_the_models_own_image_generation(janus, guidance):
    batch = janus.encode_prompts(PROMPTS, guidance=True)
    ours = ARDecoding().decode(janus, batch, SamplingConfig(temperature=0, guidance_scale=guidance)).codes
    conditional = slice(0, len(PROMPTS))
    theirs = janus.model.generate(
        input_ids=batch.input_ids[conditional],
        attention_mask=batch.attention_mask[conditional],
        generation_mode="image",
        do_sample=False,
        guidance_scale=guidance,
    )
    assert torch.equal(ours.flatten(1), theirs)


def test_prompts_follow_deepseeks_template_and_janus_guidance(janus):
    batch = janus.encode_prompts(["a red dog"], guidance=True)
    ids, tokenizer = batch.input_ids.tolist(), janus.tokenizer
    text = tokenizer("<|User|>: a red dog\n\n<|Assistant|>:", add_special_tokens=False)["input_ids"]
    assert ids[0] == [janus.bos_token_id, *text, janus.boi_token_id]
    # JanusForConditionalGeneration.generate's unconditional row: all but BOS and begin-of-image padded out.
    assert ids[1] == [janus.bos_token_id, *[janus.pad_token_id] * len(text), janus.boi_token_id]
    assert janus.default_guidance_scale == 5.0 and janus.grid.has_eol is False


def test_codes_decode_through_janus_vq_model(janus):
    codes = torch.randint(0, janus.grid.codebook_size, (2, 4, 4))
    pixels = janus.decode_codes(codes)
    theirs = janus.model.decode_image_tokens(codes.flatten(1)).permute(0, 3, 1, 2)  # [-1, 1], channels last
    assert pixels.shape == (2, 3, *janus.image_size) == (2, 3, 8, 8)
    torch.testing.assert_close(pixels, ((theirs + 1) / 2).clamp(0, 1))


def test_begin_of_image_comes_from_the_tokenizer_when_generation_kwargs_were_dropped():
    """transformers drops generation_kwargs from a generation_config.json marked _from_model_config."""
    model, tokenizer = tiny_janus()
    boi = model.generation_config.generation_kwargs["boi_token_id"]
    del model.generation_config.generation_kwargs
    assert JanusProBackbone(model, tokenizer).boi_token_id == boi
    with pytest.raises(ValueError, match="begin-of-image"):
        JanusProBackbone(model)


def test_distill_cli_trains_heads_on_a_saved_checkpoint(janus, tmp_path):
    janus.model.save_pretrained(tmp_path / "janus")
    janus.tokenizer.save_pretrained(tmp_path / "janus")
    (tmp_path / "prompts.txt").write_text("a red dog\nthe cat in the rain\n")
    options = ["--horizontal", "3", "--steps", "3", "--guidance", "5", "--images-per-prompt", "2"]
    main(
        [
            "--model",
            str(tmp_path / "janus"),
            "--prompts",
            str(tmp_path / "prompts.txt"),
            "--out",
            str(tmp_path / "heads"),
            *options,
        ]
    )
    heads = DraftHeads.from_pretrained(tmp_path / "heads")
    assert heads.config.base_model == str(tmp_path / "janus") and heads.config.codebook_size == janus.grid.codebook_size
    assert json.loads((tmp_path / "heads" / "distill_log.json").read_text())["processes"][0]["images"] == 4
