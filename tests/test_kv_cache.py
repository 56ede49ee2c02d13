"""The preallocated KV cache behaves like transformers' DynamicLayer: append, crop, append again, grow."""

import torch

from ssd_pipelines.backbones.kv_cache import PreallocatedLayer, preallocated_cache


def _kv(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, length, 4, generator=g), torch.randn(2, 3, length, 4, generator=g)


def test_appends_crops_and_overwrites_like_concatenation():
    layer = PreallocatedLayer(capacity=6)
    (k1, v1), (k2, v2), (k3, v3) = _kv(3, 0), _kv(2, 1), _kv(2, 2)
    layer.update(k1, v1)
    layer.update(k2, v2)
    layer.crop(-2)  # roll back the second update
    keys, values = layer.update(k3, v3)
    assert torch.equal(keys, torch.cat([k1, k3], dim=-2))
    assert torch.equal(values, torch.cat([v1, v3], dim=-2))
    assert layer.get_seq_length() == 5


def test_grows_when_the_capacity_hint_was_too_small():
    layer = PreallocatedLayer(capacity=2)
    chunks = [_kv(n, seed) for seed, n in enumerate((2, 3, 1))]
    for k, v in chunks:
        keys, values = layer.update(k, v)
    assert layer.capacity >= 6
    assert torch.equal(keys, torch.cat([k for k, _ in chunks], dim=-2))
    assert torch.equal(values, torch.cat([v for _, v in chunks], dim=-2))


def test_cache_crops_every_layer():
    cache = preallocated_cache(8)
    for layer_idx in range(2):
        cache.update(*_kv(5, layer_idx), layer_idx)
    cache.crop(-3)
    assert [layer.get_seq_length() for layer in cache.layers] == [2, 2]
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
