"""Resumable backbone training: the warm-up-stable-decay schedule and a state saved as safetensors."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from ssd_pipelines.reference.caption_tokenizer import build_caption_tokenizer
from ssd_pipelines.testing import tiny_vqvae
from ssd_pipelines.training.backbone import (
    BackboneConfig,
    build_backbone,
    image_loss,
    learning_rate,
    reference_grid_tokens,
    train_backbone,
    training_batch,
)
from ssd_pipelines.training.encoded_scenes import encode_scenes
from ssd_pipelines.training.training_state import load_optimizer_state, save_training_state

TINY = BackboneConfig(
    hidden_size=32, layers=1, attention_heads=2, intermediate_size=64, images=16, steps=20, batch_size=4,
    lr=3e-3, warmup_steps=5, log_every=5, schedule="wsd", decay_fraction=0.5,
)  # fmt: skip


def test_wsd_warms_up_holds_then_decays_linearly_to_a_tenth():
    config = replace(TINY, steps=110, warmup_steps=10, decay_fraction=0.2, lr=1.0)
    assert learning_rate(4, 0.0, config) == pytest.approx(0.5)
    assert learning_rate(50, 0.0, config) == learning_rate(90, 0.0, config) == 1.0  # progress 0.8: decay starts
    assert learning_rate(100, 0.0, config) == pytest.approx(0.55)  # half-way through the decay
    assert learning_rate(110, 0.0, config) == pytest.approx(0.1)
    assert learning_rate(0, 0.0, replace(config, resume="state")) == 1.0  # a resumed run is already warm
    config = replace(config, steps=10**6, max_minutes=10.0)  # the time budget, when it ends first
    assert learning_rate(50, 0.9 * 600, config) == pytest.approx(0.55)


def _step(model, optimizer, ids, boi):
    optimizer.zero_grad()
    image_loss(model, ids, boi).backward()
    optimizer.step()


def test_a_resumed_state_continues_the_optimizer_exactly(tmp_path):
    tokenizer = build_caption_tokenizer()
    tokens = reference_grid_tokens(tokenizer, 8)
    data = encode_scenes(tiny_vqvae(), tokenizer, range(4))
    ids, boi = training_batch(
        data, np.array([0]), tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, 0.0, np.random.default_rng(0)
    )
    model = build_backbone(TINY, tokens, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer, ids, boi)
    _step(model, optimizer, ids, boi)
    save_training_state(model, optimizer, 2, tmp_path / "state")

    resumed = build_backbone(replace(TINY, resume=str(tmp_path / "state")), tokens, tokenizer)
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    assert load_optimizer_state(resumed, resumed_optimizer, tmp_path / "state") == 2
    _step(model, optimizer, ids, boi)
    _step(resumed, resumed_optimizer, ids, boi)
    for ours, theirs in zip(resumed.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_a_wsd_run_saves_its_state_where_the_decay_begins_and_a_later_run_resumes_it(tmp_path):
    torch.manual_seed(0)
    tokenizer, vq = build_caption_tokenizer(), tiny_vqvae()
    _, log = train_backbone(TINY, vq, tokenizer, state_folder=tmp_path / "state")
    assert log["state_step"] == 13  # warm-up 5, then (13 - 5) / 15 >= 0.5
    _, resumed = train_backbone(replace(TINY, resume=str(tmp_path / "state"), steps=10), vq, tokenizer)
    assert resumed["first_step"] == 13 and [e["step"] for e in resumed["loss"]] == [18, 23]


def test_a_broken_or_foreign_state_and_init_with_resume_are_refused(tmp_path):
    tokenizer = build_caption_tokenizer()
    tokens = reference_grid_tokens(tokenizer, 8)
    with pytest.raises(ValueError, match="not both"):
        build_backbone(replace(TINY, init="a", resume="b"), tokens, tokenizer)
    small = build_backbone(TINY, tokens, tokenizer)
    save_training_state(small, torch.optim.AdamW(small.parameters()), 0, tmp_path / "empty")  # no moments yet
    with pytest.raises(ValueError, match="it is the state of another model"):
        load_optimizer_state(small, torch.optim.AdamW(small.parameters()), tmp_path / "empty")
    (tmp_path / "empty" / "optimizer.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="is not a readable optimizer state"):
        load_optimizer_state(small, torch.optim.AdamW(small.parameters()), tmp_path / "empty")
