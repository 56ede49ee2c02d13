import json

import pytest
import torch
import torch.nn.functional as F

from ssd_pipelines import DraftHeads
from ssd_pipelines.testing import tiny_backbone, tiny_heads


def test_head_computes_w0z_plus_swiglu_of_rmsnorm(heads):
    head = heads.vertical[0]
    h, e = torch.randn(3, heads.config.hidden_size), torch.randn(3, heads.config.embed_size)
    x = torch.cat([h, e], -1) @ head.proj.weight.T
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * head.norm.weight
    expected = x + (F.silu(n @ head.gate.weight.T) * (n @ head.up.weight.T)) @ head.down.weight.T
    torch.testing.assert_close(head(h, e), expected)


def test_drafting_shapes(heads):
    h, e = torch.randn(2, 32), torch.randn(2, 32)
    assert heads.draft_right(h, e, 3).shape == (2, 3, 32)
    assert heads.draft_below(torch.randn(2, 5, 32), torch.randn(2, 5, 32), 2).shape == (2, 2, 5, 32)


def test_save_and_load_round_trip_as_safetensors(heads, tmp_path):
    heads.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["embed_size"] == 32 and config["codebook_size"] == 8
    assert config["horizontal_offsets"] == [1, 2, 3, 4, 5] and config["vertical_offsets"] == [1, 2]
    assert config["base_model"] == "tests/tiny-llama"
    loaded = DraftHeads.from_pretrained(tmp_path)
    h, e = torch.randn(4, 32), torch.randn(4, 32)
    torch.testing.assert_close(loaded.draft_right(h, e, 5), heads.draft_right(h, e, 5))


def test_heads_for_another_backbone_name_both_shapes():
    other = tiny_backbone(rows=4, cols=5, codebook_size=8, hidden_size=16)
    heads = tiny_heads(tiny_backbone(rows=4, cols=5, codebook_size=8))
    with pytest.raises(ValueError, match=r"heads expect .* = \(32, 32, 8\), the backbone has \(16, 16, 8\)"):
        heads.check_compatible(other)


def test_offsets_must_be_contiguous_from_one():
    with pytest.raises(ValueError, match="contiguous from 1"):
        DraftHeads(hidden_size=8, embed_size=8, codebook_size=4, horizontal_offsets=(1, 3))
    with pytest.raises(ValueError, match="at least one vertical offset"):
        DraftHeads(hidden_size=8, embed_size=8, codebook_size=4, vertical_offsets=())
