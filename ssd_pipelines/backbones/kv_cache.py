"""A rewindable KV cache that writes into preallocated buffers.

transformers' `DynamicLayer` concatenates on every update, so generating T tokens
copies O(T^2) keys and values, and on CPU each new multi-megabyte tensor is fresh
memory from the OS. With guidance doubling a batch of dozens of images, that
copying, not the model, dominated batched generation. This layer keeps the same
interface (`crop` just shortens a view) but appends in place, growing by doubling
only if a hint of the final length was too small.

Strategies whose images advance at different speeds write each batch row at its
own slots instead (`write_rows_at`): a row's token at image position s always
lives in slot prompt + s, so what a row has not committed is simply masked, and
nothing is ever copied or cropped. A pass may also write tokens at scattered
slots (a tree of candidates, several image rows at once).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

StateFull = Callable[..., torch.Tensor]  # (role, shape, fill, dtype, device) -> a filled tensor


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are views into buffers of `capacity` positions."""

    def __init__(self, capacity: int, state_full: StateFull | None = None, role: str = "cache"):
        """state_full(role, shape, fill, dtype, device): where the buffers come from (the runner's `full`, which
        holds them from call to call where passes replay as CUDA graphs); default: new ones."""
        super().__init__()
        self.capacity = max(1, capacity)
        self.state_full, self.role = state_full, role
        self.row_slots: torch.Tensor | None = None  # [B, n]: the next update writes row b's entries at these slots
        self.row_length = 0  # slots the next ragged update returns

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._key_buffer = self._allocate(key_states, self.capacity, "keys")
        self._value_buffer = self._allocate(value_states, self.capacity, "values")
        self.keys, self.values = self._key_buffer[..., :0, :], self._value_buffer[..., :0, :]
        self.is_initialized = True

    def _allocate(self, like: torch.Tensor, length: int, which: str) -> torch.Tensor:
        """Zeros, not uninitialised memory: a masked slot still enters attention as weight 0 x value, and
        0 x NaN garbage would be NaN (rows written at their own slots leave slots unwritten)."""
        batch, heads, _, dim = like.shape
        if self.state_full is None:
            return like.new_zeros(batch, heads, length, dim)
        return self.state_full(f"{self.role}.{which}", (batch, heads, length, dim), 0, like.dtype, like.device)

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        for name, which in (("_key_buffer", "keys"), ("_value_buffer", "values")):
            old = getattr(self, name)
            new = self._allocate(old, self.capacity, which)
            new[..., : old.shape[-2], :] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.row_slots is not None:
            return self._update_rows(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values

    def _update_rows(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """Write row b's n new entries at slots row_slots[b]; return the first `row_length` slots."""
        if self.row_length > self.capacity:
            self._grow(self.row_length)
        batch, heads, n, dim = key_states.shape
        index = self.row_slots[:, None, :, None].expand(batch, heads, n, dim)
        self._key_buffer.scatter_(2, index, key_states)
        self._value_buffer.scatter_(2, index, value_states)
        self.keys, self.values = (
            self._key_buffer[..., : self.row_length, :],
            self._value_buffer[..., : self.row_length, :],
        )
        return self.keys, self.values


def write_rows_at(cache: Cache, row_slots: torch.Tensor, length: int) -> None:
    """The next forward pass writes batch row b's entries at slots row_slots[b] [B, n], and attends over `length`
    slots."""
    for layer in cache.layers:
        layer.row_slots, layer.row_length = row_slots, length


class PreallocatedCache(Cache):
    """A cache of `PreallocatedLayer`s that also hands back the hidden states its last pass fed the final norm
    (`causal_lm.record_norm_input` writes them). They live on the cache, which belongs to one call: concurrent calls
    on one model each read their own, and torch.compile traces the hand-over inside the pass's graph."""

    def __init__(self, capacity: int, state_full: StateFull | None = None):
        layers = itertools.count()  # transformers makes the layers in order, each on its first update
        super().__init__(
            layer_class_to_replicate=lambda: PreallocatedLayer(capacity, state_full, f"cache.{next(layers)}")
        )
        self.norm_input: torch.Tensor | None = None
        self.compile_key = ("cache", capacity)  # the compiled passes' specialization (`compiled.signature`)


def preallocated_cache(capacity: int, state_full: StateFull | None = None) -> PreallocatedCache:
    """A cache (one `PreallocatedLayer` per decoder layer) sized for `capacity` positions, its buffers from
    `state_full` when given."""
    return PreallocatedCache(capacity, state_full)
