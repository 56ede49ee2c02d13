"""Smoke test of the reference backbone trainer: a few steps on a tiny configuration."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from ssd_pipelines import LlamaGridBackbone, SSDAutoregressivePipeline
from ssd_pipelines.reference.caption_tokenizer import build_caption_tokenizer
from ssd_pipelines.testing import tiny_vqvae
from ssd_pipelines.training.backbone import (
    BackboneConfig,
    build_backbone,
    image_sequence,
    learning_rate,
    reference_grid_tokens,
    train_backbone,
    training_batch,
    training_seeds,
)
from ssd_pipelines.training.encoded_scenes import encode_scenes

TINY = BackboneConfig(
    hidden_size=32,
    layers=1,
    attention_heads=2,
    intermediate_size=64,
    images=64,
    steps=30,
    batch_size=8,
    lr=3e-3,
    warmup_steps=5,
    log_every=5,
)


def test_sequences_follow_the_adapters_layout():
    tokenizer = build_caption_tokenizer()
    tokens = reference_grid_tokens(tokenizer, 8)
    codes = torch.arange(256).remainder(8).view(1, 16, 16)
    seq = image_sequence(codes, tokens)[0]
    assert seq.shape == (16 * 17 + 1,)
    assert seq[16] == tokens.eol_token_id and seq[-1] == tokens.eoi_token_id
    assert seq[17] == codes[0, 1, 0] + tokens.code_offset


def test_dropped_captions_become_the_adapters_unconditional_prompt():
    tokenizer = build_caption_tokenizer()
    data = encode_scenes(tiny_vqvae(), tokenizer, range(4))
    tokens = reference_grid_tokens(tokenizer, 8)
    adapter = LlamaGridBackbone(build_backbone(TINY, tokens, tokenizer), tokenizer)
    rng = np.random.default_rng(0)
    ids, boi = training_batch(data, np.array([0]), tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, 1.0, rng)
    batch = adapter.encode_prompts([tokenizer.decode(data.captions[0])], guidance=True)
    assert ids[0, : boi + 1].tolist() == batch.input_ids[1].tolist()  # the unconditional row
    ids, _ = training_batch(data, np.array([0]), tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, 0.0, rng)
    assert ids[0, : boi + 1].tolist() == batch.input_ids[0].tolist()  # the conditional row


def test_a_few_steps_lower_the_loss_and_the_model_plugs_into_the_pipeline(tmp_path):
    torch.manual_seed(0)
    tokenizer = build_caption_tokenizer()
    vq = tiny_vqvae()
    model, log = train_backbone(replace(TINY, scene_cache=str(tmp_path / "scenes.safetensors")), vq, tokenizer)
    losses = [entry["loss"] for entry in log["loss"]]
    assert losses[-1] < 0.8 * losses[0], losses
    # each entry logs the lr of its last step (the schedule is by steps here: no time budget)
    assert [e["lr"] for e in log["loss"]] == pytest.approx(
        [learning_rate(e["step"] - 1, 0.0, TINY) for e in log["loss"]]
    )
    assert (tmp_path / "scenes.safetensors").is_file()  # the next run reads the encoded scenes back
    pipe = SSDAutoregressivePipeline(model, tokenizer, vq)
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a red circle", decoding="ar", generator=torch.Generator().manual_seed(0))
    assert out.images[0].size == (64, 64) and out.codes.shape == (1, 16, 16)


def test_a_run_continues_from_a_saved_backbone_and_refuses_another_layout(tmp_path):
    tokenizer = build_caption_tokenizer()
    tokens = reference_grid_tokens(tokenizer, 8)
    earlier = build_backbone(TINY, tokens, tokenizer)
    earlier.save_pretrained(tmp_path / "earlier")
    continued = build_backbone(replace(TINY, init=str(tmp_path / "earlier")), tokens, tokenizer)
    for ours, theirs in zip(continued.parameters(), earlier.parameters()):
        assert torch.equal(ours, theirs)
    other_codebook = reference_grid_tokens(tokenizer, 16)
    with pytest.raises(ValueError, match="does not match the expected"):
        build_backbone(replace(TINY, init=str(tmp_path / "earlier")), other_codebook, tokenizer)


def test_task_weights_choose_the_training_scenes():
    assert training_seeds(replace(TINY, images=12)) == range(12)
    weighted = training_seeds(replace(TINY, images=12, task_weights="color_attr=2, position=4"))
    assert len(weighted) == 12 and weighted != list(range(12))
    with pytest.raises(ValueError, match="task weight 'position' is not task=number, e.g. color_attr=3"):
        training_seeds(replace(TINY, task_weights="position"))
