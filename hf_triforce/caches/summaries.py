"""``ChunkSummaries``: the mean key of every chunk of every layer of a ``RetrievalCache``, side by side.

One ``[L, B, H_kv, C, D]`` tensor lets a selection score every layer in one operation over a view
(:meth:`ChunkSummaries.stacked`), with no copy; layers on different devices (``device_map``) keep one tensor each.
"""

from __future__ import annotations

import torch

from ..kernels.retrieval import chunk_means


class ChunkSummaries:
    """Chunk means of a cache's layers (each ``buffer.keys`` ``[B, H_kv, L, D]``), computed lazily: only new chunks.

    Example:
        >>> from hf_triforce.caches.retrieval import RetrievalCache
        >>> cache = RetrievalCache(num_layers=2, chunk_size=8)
        >>> for i in range(2):
        ...     _ = cache.update(torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), layer_idx=i)
        >>> cache.summaries.layer(0).shape
        torch.Size([1, 2, 2, 16])
        >>> cache.summaries.stacked(2).shape  # [L * B, H_kv, C, D]: a view, no copy
        torch.Size([2, 2, 2, 16])
    """

    def __init__(self, layers: list, chunk_size: int = 8) -> None:
        self.layers, self.chunk_size = layers, chunk_size
        self.done = [0] * len(layers)  # complete chunks summarized, per layer
        self.per_layer: list[torch.Tensor | None] = [None] * len(layers)  # [B, H_kv, room, D] each
        self.shared: torch.Tensor | None = None  # [L, B, H_kv, room, D] when every layer lives in one place

    def layer(self, index: int) -> torch.Tensor:
        """``[B, H_kv, L // chunk_size, D]``: the chunk means of layer ``index``'s cached keys."""
        buffer = self.layers[index].buffer
        n = buffer.length // self.chunk_size
        if self.per_layer[index] is None or self.per_layer[index].shape[2] < n:
            self._grow(index, n)
        start, out = self.done[index], self.per_layer[index]
        if start < n:
            keys = buffer.read_keys(start * self.chunk_size, n * self.chunk_size)  # the new chunks only
            out[:, :, start:n] = chunk_means(keys, self.chunk_size)
            self.done[index] = n
        return out[:, :, :n]

    def stacked(self, n: int) -> torch.Tensor | None:
        """``[L * B, H_kv, n, D]`` view of every layer's first ``n`` chunk means, or ``None`` if the layers do not share
        one tensor. Call :meth:`layer` for each layer first."""
        return None if self.shared is None else self.shared[:, :, :, :n].flatten(0, 1)

    def crop(self, index: int, chunks: int) -> None:
        """Layer ``index`` keeps only its first ``chunks`` summaries (its cache was cropped or reset)."""
        self.done[index] = min(self.done[index], chunks)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the batch rows at ``rows`` (``[B']`` indices) remain, in every layer."""
        if self.shared is not None:
            self._share(self.shared[:, rows])
        else:
            self.per_layer = [None if t is None else t[rows] for t in self.per_layer]

    def _grow(self, index: int, n: int) -> None:
        """Room for ``n`` chunk means in layer ``index`` (doubling, at least its buffer's capacity), keeping the old."""
        old = self.per_layer[index]
        capacity = self.layers[index].buffer.capacity
        room = max(n, 2 * (0 if old is None else old.shape[2]), capacity // self.chunk_size + 1)
        if self.shared is not None or (old is None and self.one_place()):
            self._grow_shared(room)
            return
        keys = self.layers[index].buffer.like()
        grown = keys.new_empty((*keys.shape[:2], room, keys.shape[-1]))
        if old is not None:
            grown[:, :, : old.shape[2]] = old
        self.per_layer[index] = grown

    def _grow_shared(self, room: int) -> None:
        """One ``[L, B, H_kv, room, D]`` tensor for all layers (layers that had their own recompute their means)."""
        keys = self.layers[0].buffer.like()
        shared = keys.new_empty((len(self.layers), *keys.shape[:2], room, keys.shape[-1]))
        if self.shared is not None:
            shared[:, :, :, : self.shared.shape[3]] = self.shared
        else:
            self.done = [0] * len(self.layers)
        self._share(shared)

    def one_place(self) -> bool:
        """Whether every layer is initialized and its keys have one device, dtype, batch, heads and head size."""
        if not all(layer.is_initialized for layer in self.layers):
            return False
        keys = [layer.buffer.like() for layer in self.layers]
        return len({(k.device, k.dtype, k.shape[:2], k.shape[-1]) for k in keys}) == 1

    def _share(self, shared: torch.Tensor) -> None:
        self.shared, self.per_layer = shared, list(shared.unbind(0))
