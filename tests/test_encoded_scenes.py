"""The encoded-scene cache: written once, read back equal, refused when it belongs to another run."""

import pytest
import torch

from ssd_pipelines.reference.caption_tokenizer import build_caption_tokenizer
from ssd_pipelines.testing import tiny_vqvae
from ssd_pipelines.training import encoded_scenes
from ssd_pipelines.training.encoded_scenes import cached_scenes, encode_scenes


def test_a_cache_is_written_once_and_read_back_equal(tmp_path, monkeypatch):
    tokenizer, vq, cache = build_caption_tokenizer(), tiny_vqvae(), tmp_path / "scenes.safetensors"
    written = cached_scenes(vq, tokenizer, range(5), cache)
    assert cache.is_file()
    monkeypatch.setattr(encoded_scenes, "encode_scenes", lambda *a, **k: pytest.fail("encoded again"))
    read = cached_scenes(vq, tokenizer, range(5), cache)
    assert read.captions == written.captions and len({len(c) for c in read.captions}) > 1
    assert read.codes.dtype == torch.long and torch.equal(read.codes, written.codes)


def test_a_cache_of_other_seeds_another_vq_or_a_corrupt_file_is_refused(tmp_path):
    tokenizer, vq, cache = build_caption_tokenizer(), tiny_vqvae(), tmp_path / "scenes.safetensors"
    cached_scenes(vq, tokenizer, range(3), cache)
    with pytest.raises(ValueError, match="holds the scenes of seeds 0-3, not this run's 0-4"):
        cached_scenes(vq, tokenizer, range(4), cache)
    with pytest.raises(ValueError, match="encoded by another VQ"):
        cached_scenes(tiny_vqvae(seed=1), tokenizer, range(3), cache)
    cache.write_bytes(cache.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable scene cache"):
        cached_scenes(vq, tokenizer, range(3), cache)


def test_a_cache_of_chosen_seeds_names_them_by_digest(tmp_path):
    tokenizer, vq, cache = build_caption_tokenizer(), tiny_vqvae(), tmp_path / "scenes.safetensors"
    written = cached_scenes(vq, tokenizer, [4, 2, 9], cache)
    assert torch.equal(written.codes[1], cached_scenes(vq, tokenizer, range(2, 3)).codes[0])
    assert torch.equal(cached_scenes(vq, tokenizer, [4, 2, 9], cache).codes, written.codes)
    with pytest.raises(ValueError, match=r"holds the scenes of seeds 3 seeds, sha256 \w+, not this run's 3 seeds"):
        cached_scenes(vq, tokenizer, [4, 2, 8], cache)


def test_scenes_rendered_by_worker_processes_are_the_same_scenes_in_the_same_order():
    tokenizer, vq = build_caption_tokenizer(), tiny_vqvae()
    here = encode_scenes(vq, tokenizer, [7, 3, 11, 5, 2], batch_size=2)
    spawned = encode_scenes(vq, tokenizer, [7, 3, 11, 5, 2], batch_size=2, workers=2)
    assert spawned.captions == here.captions
    assert torch.equal(spawned.codes, here.codes)
