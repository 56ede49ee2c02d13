"""Loading pipelines and heads from a Hub: a loopback one (tests/hub_server.py), then its cache offline."""

from pathlib import Path

import pytest
import torch
from huggingface_hub import constants, hf_hub_download

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_pipeline


def codes(pipe, **kwargs):
    pipe.set_progress_bar_config(disable=True)
    return pipe("a red circle", generator=torch.Generator().manual_seed(0), output_type="latent", **kwargs).codes


@pytest.fixture
def published(hub):
    """org/tiny-base: a pipeline without heads; org/tiny-heads: heads naming it as their base model."""
    base = tiny_pipeline(with_heads=False)
    base.push_to_hub("org/tiny-base", token="hf_writer")
    heads = tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8))
    heads.register_to_config(base_model="org/tiny-base")
    heads.push_to_hub("org/tiny-heads", token="hf_writer")
    return base, heads


def test_push_to_hub_then_from_pretrained_round_trips(hub):
    pipe = tiny_pipeline()
    pipe.push_to_hub("org/tiny-ssd", token="hf_writer")
    hub.add_repo("org/tiny-ssd", {**hub.files("org/tiny-ssd"), "notes/large-unused.bin": b"\0" * 1000})
    loaded = SSDAutoregressivePipeline.from_pretrained("org/tiny-ssd", token="hf_reader")
    assert torch.equal(codes(loaded), codes(pipe))
    fetched = hub.downloaded("org/tiny-ssd")
    assert "notes/large-unused.bin" not in fetched and "heads/diffusion_pytorch_model.safetensors" in fetched
    assert "Bearer hf_reader" in {r.authorization for r in hub.requests}


def test_a_heads_repository_pulls_its_base_model(hub, published):
    base, heads = published
    pipe = SSDAutoregressivePipeline.from_pretrained("org/tiny-heads")
    assert sorted(hub.downloaded("org/tiny-heads")) == ["config.json", "diffusion_pytorch_model.safetensors"]
    base.heads = heads
    assert torch.equal(codes(pipe), codes(base))


def test_a_base_repository_with_heads_given(hub, published):
    _base, heads = published
    for given in ("org/tiny-heads", heads):
        pipe = SSDAutoregressivePipeline.from_pretrained("org/tiny-base", heads=given)
        assert pipe.heads is not None and codes(pipe, decoding="exact").shape == (1, 4, 4)


def test_revision_picks_the_version(hub, published):
    sha = hub.add_repo("org/tiny-heads", hub.files("org/tiny-heads"), revision="v2")
    pipe = SSDAutoregressivePipeline.from_pretrained("org/tiny-heads", revision=sha)
    assert pipe.heads is not None
    with pytest.raises(ValueError, match="has no revision 'nope'"):
        SSDAutoregressivePipeline.from_pretrained("org/tiny-heads", revision="nope")


def test_heads_trained_for_another_base_model_are_refused(hub, published):
    _, heads = published
    heads.register_to_config(base_model="org/another-model")
    with pytest.raises(ValueError, match="trained for 'org/another-model', not for 'org/tiny-base'"):
        SSDAutoregressivePipeline.from_pretrained("org/tiny-base", heads=heads)


def test_offline_loading_from_the_cache(hub, published, monkeypatch):
    online = codes(SSDAutoregressivePipeline.from_pretrained("org/tiny-heads"))
    hub.close()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert torch.equal(codes(SSDAutoregressivePipeline.from_pretrained("org/tiny-heads")), online)
    with pytest.raises(
        ValueError, match="'org/never-downloaded' is no local folder, is not in the local Hugging Face cache"
    ):
        SSDAutoregressivePipeline.from_pretrained("org/never-downloaded")


def test_an_unknown_repository(hub):
    with pytest.raises(ValueError, match="neither a local folder nor a Hub repository"):
        SSDAutoregressivePipeline.from_pretrained("org/missing")


def test_force_download_fetches_a_damaged_file_again(hub):
    """The loaders' advice for a damaged file, force_download=True, reaches the Hub (it was dropped before)."""
    pipe = tiny_pipeline()
    pipe.push_to_hub("org/tiny-ssd", token="hf_writer")
    SSDAutoregressivePipeline.from_pretrained("org/tiny-ssd")
    cached = hf_hub_download("org/tiny-ssd", "heads/diffusion_pytorch_model.safetensors", local_files_only=True)
    blob = Path(cached).resolve()
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"re-download them \(force_download=True\)"):
        SSDAutoregressivePipeline.from_pretrained("org/tiny-ssd")
    loaded = SSDAutoregressivePipeline.from_pretrained("org/tiny-ssd", force_download=True)
    assert torch.equal(codes(loaded), codes(pipe))


@pytest.mark.parametrize("base_model", ["/srv/models/private", "./private", "~/private", "../up/one"])
def test_a_heads_repository_may_not_point_at_this_machines_folders(hub, tmp_path, base_model):
    """Issue 56: a file's contents chose which local folder was opened; a Hub repository cannot know ours."""
    heads = tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8))
    heads.register_to_config(base_model=base_model)
    heads.push_to_hub("org/pointing-heads", token="hf_writer")
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained("org/pointing-heads")
    assert str(caught.value) == (
        f"the heads repository org/pointing-heads names {base_model!r} as its base model, which is not a Hub "
        "repository id: a downloaded repository may not point at this machine's files. Load the base pipeline "
        "yourself and pass the heads: from_pretrained(BASE, heads='org/pointing-heads')."
    )
    tiny_pipeline(with_heads=False).save_pretrained(tmp_path / "base")  # given by the user, the same heads load
    assert SSDAutoregressivePipeline.from_pretrained(tmp_path / "base", heads="org/pointing-heads").heads is not None
