"""Held-out loss split into object and background cells."""

import numpy as np
import pytest
import torch

from ssd_pipelines.reference.caption_tokenizer import build_caption_tokenizer
from ssd_pipelines.reference.scenes import RenderedObject, SceneSpec
from ssd_pipelines.testing import tiny_vqvae
from ssd_pipelines.training.backbone import (
    BackboneConfig,
    build_backbone,
    image_nll,
    reference_grid_tokens,
    training_batch,
)
from ssd_pipelines.training.encoded_scenes import encode_scenes
from ssd_pipelines.training.heldout_loss import code_losses, main, object_cells, split_losses

TINY = BackboneConfig(hidden_size=32, layers=1, attention_heads=2, intermediate_size=64)


def test_object_cells_cover_every_code_the_box_touches():
    tokens = reference_grid_tokens(build_caption_tokenizer(), 8)
    square = RenderedObject("square", "red", "small", 12, (11.0, 10.5), (5, 9, 17, 12))
    cells = object_cells(SceneSpec("single_object", (), rendered=(square,)), tokens)
    expected = np.zeros((16, 16), dtype=bool)
    expected[2, 1:5] = True  # pixel rows 9..11 are code row 2; pixel columns 5..16 are code columns 1..4
    assert np.array_equal(cells, expected)


def test_batched_code_losses_equal_one_scene_at_a_time():
    torch.manual_seed(0)
    tokenizer = build_caption_tokenizer()
    tokens = reference_grid_tokens(tokenizer, 8)
    model = build_backbone(TINY, tokens, tokenizer).eval()
    data = encode_scenes(tiny_vqvae(), tokenizer, range(6))
    assert len({len(c) for c in data.captions}) > 1  # batches of several caption lengths
    losses = code_losses(model, data, tokens, tokenizer)
    rng = np.random.default_rng(0)
    for i in range(6):
        ids, boi = training_batch(data, np.array([i]), tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, 0.0, rng)
        with torch.no_grad():
            nll = image_nll(model, ids, boi)[0, :-1].view(16, 17)[:, :16]
        torch.testing.assert_close(losses[i], nll, rtol=1e-4, atol=1e-5)
    objects = np.zeros((6, 16, 16), dtype=bool)
    objects[:, :4] = True
    split = split_losses(losses, objects)
    assert split["object"] == pytest.approx(losses[:, :4].mean().item())
    assert split["all"] == pytest.approx((split["object"] + 3 * split["background"]) / 4)


def test_the_command_prints_one_row_per_backbone_and_refuses_another_codebook(tmp_path, capsys):
    tokenizer = build_caption_tokenizer()
    tiny_vqvae().save_pretrained(tmp_path / "vq")
    build_backbone(TINY, reference_grid_tokens(tokenizer, 8), tokenizer).save_pretrained(tmp_path / "ours")
    main([str(tmp_path / "ours"), "--vq", str(tmp_path / "vq"), "--scenes", "3"])
    row = [line for line in capsys.readouterr().out.splitlines() if "ours" in line]
    assert len(row) == 1 and len(row[0].split("|")) == 6
    build_backbone(TINY, reference_grid_tokens(tokenizer, 16), tokenizer).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="does not match the expected"):
        main([str(tmp_path / "other"), "--vq", str(tmp_path / "vq"), "--scenes", "3"])
