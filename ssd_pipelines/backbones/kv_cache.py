"""A rewindable KV cache that writes into preallocated buffers.

transformers' `DynamicLayer` concatenates on every update, so generating T tokens
copies O(T^2) keys and values, and on CPU each new multi-megabyte tensor is fresh
memory from the OS. With guidance doubling a batch of dozens of images, that
copying, not the model, dominated batched generation. This layer keeps the same
interface (`crop` just shortens a view) but appends in place, growing by doubling
only if a hint of the final length was too small.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are views into buffers of `capacity` positions."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(1, capacity)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._key_buffer = self._allocate(key_states, self.capacity)
        self._value_buffer = self._allocate(value_states, self.capacity)
        self.keys, self.values = self._key_buffer[..., :0, :], self._value_buffer[..., :0, :]
        self.is_initialized = True

    @staticmethod
    def _allocate(like: torch.Tensor, length: int) -> torch.Tensor:
        batch, heads, _, dim = like.shape
        return like.new_empty(batch, heads, length, dim)

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = self._allocate(old, self.capacity)
            new[..., : old.shape[-2], :] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


def preallocated_cache(capacity: int) -> Cache:
    """A cache (one `PreallocatedLayer` per decoder layer) sized for `capacity` positions."""
    return Cache(layer_class_to_replicate=lambda: PreallocatedLayer(capacity))
