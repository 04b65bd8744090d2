"""The base of every hf_triforce cache layer: a transformers ``CacheLayerMixin`` over a :class:`KVBuffer`."""

from __future__ import annotations

import torch
from transformers import Cache, CacheLayerMixin

from .buffers import KVBuffer


class BufferedLayer(CacheLayerMixin):
    """A cache layer whose keys and values live in ``self.buffer`` (``KVBuffer(capacity)`` preallocates).

    ``update`` appends ``[B, H_kv, q, D]`` states and returns the ``[B, H_kv, length, D]`` views; ``crop`` takes
    transformers' negative count; ``get_mask_sizes`` is ``(length + q, 0)``.

    Example:
        >>> layer = BufferedLayer(KVBuffer(capacity=8))
        >>> keys, _ = layer.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
        >>> keys.shape, layer.get_seq_length(), layer.get_mask_sizes(1)
        (torch.Size([1, 2, 3, 4]), 3, (4, 0))
    """

    is_sliding = False
    is_croppable = True
    start = 0  # the position of slot 0 (a view's slots are compacted; a sliding layer's window moves it)

    def __init__(self, buffer: KVBuffer) -> None:
        super().__init__()
        self.buffer = buffer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.buffer.append(key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffer.length + query_length, self.start

    def get_seq_length(self) -> int:
        return self.buffer.length

    def get_max_length(self) -> int:
        return -1

    def local(self, positions: torch.Tensor) -> torch.Tensor:
        """Slots of the tokens at absolute ``positions``."""
        return positions - self.start if self.start else positions

    def read_from(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the tokens from absolute ``position`` on (held: see :meth:`holds`)."""
        return self.buffer.read(position - self.start, self.buffer.length)

    def holds(self, position: int) -> bool:
        """Whether the token at absolute ``position`` (or the end) is still held."""
        return position >= self.start

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the batch rows at ``rows`` (``[B']`` indices) remain."""
        self.buffer.keep_rows(rows)
        if self.keys is not None:
            self.keys, self.values = self.buffer.read(0, self.buffer.length)

    def advance(self, count: int) -> None:
        """Count the ``count`` slots a fixed-shape step wrote as stored (host-side bookkeeping, after the step)."""
        self.buffer.advance(count)

    def crop(self, tokens_to_remove: int) -> None:
        self.buffer.crop(tokens_to_remove)
        if self.keys is not None:  # set by update(): keep them the visible slots
            self.keys, self.values = self.keys[:, :, : self.buffer.length], self.values[:, :, : self.buffer.length]


class BufferedCache(Cache):
    """A transformers ``Cache`` of :class:`BufferedLayer` layers; adds :meth:`kv_nbytes`."""

    def kv_nbytes(self) -> int:
        """Bytes allocated for keys and values over all layers."""
        return sum(layer.buffer.nbytes() for layer in self.layers)
