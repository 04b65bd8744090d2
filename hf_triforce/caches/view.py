"""Sparse views of a ``RetrievalCache``, what the level-1 forwards attend to: per layer and KV head, the tokens a
selection chose, then the full cache's tokens appended since, then drafts (which never enter the full cache)."""

from __future__ import annotations

import torch

from ..kernels.retrieval import gather_kv_into
from .base import BufferedCache, BufferedLayer
from .buffers import KVBuffer
from .offload import HostKVBuffer


def gather_selection(buffer: KVBuffer, source: KVBuffer, indices: torch.Tensor) -> int:
    """Gather full-cache storage ``source`` at ``indices`` ``[B, H_kv, S]`` into ``buffer[:S]``; returns ``S``.

    In place (:func:`~hf_triforce.kernels.retrieval.gather_kv_into`); an offloaded ``source`` copies the selected tokens
    to the device first (:meth:`~hf_triforce.caches.offload.HostKVBuffer.gather`).
    """
    selected = indices.shape[-1]
    buffer.reserve(selected, source.like())
    buffer.length = selected
    if isinstance(source, HostKVBuffer):
        keys, values = source.gather(indices)
        buffer.keys.copy_(keys)
        buffer.values.copy_(values)
    else:
        gather_kv_into(source.keys, source.values, indices, buffer.keys, buffer.values)
    return selected


class ViewLayer(BufferedLayer):
    """One layer of a sparse view: the ``S`` tokens gathered at ``indices`` ``[B, H_kv, S]``, then room for more."""

    def __init__(self, source: KVBuffer, indices: torch.Tensor, extra_capacity: int, align: int = 1) -> None:
        super().__init__(KVBuffer(indices.shape[-1] + extra_capacity, align))
        self.static_length = gather_selection(self.buffer, source, indices)
        self.lazy_initialization(self.buffer.keys, self.buffer.values)


class SparseViewMixin:
    """Bookkeeping shared by :class:`RetrievalView` and ``StaticRetrievalView``.

    Expects ``self.layers`` (each with a ``buffer`` and a ``static_length``: the gathered tokens come first),
    ``self.source`` (the :class:`RetrievalCache`) and ``self.source_length`` (its length at the selection).
    """

    @property
    def visible_length(self) -> int:
        return self.layers[0].buffer.length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        layer = self.layers[layer_idx]
        return self.source_length + layer.buffer.length - layer.static_length

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].buffer.length

    def tail_length(self) -> int:
        """Tokens of the full cache appended since the selection."""
        return self.source.get_seq_length() - self.source_length

    def sync(self) -> None:
        """Drop drafted tokens and copy the full cache's tokens added since the selection (exact KV)."""
        start = self.source_length
        for view_layer, layer in zip(self.layers, self.source.layers, strict=True):
            keys, values = layer.buffer.read(start, layer.buffer.length)
            view_layer.buffer.write(view_layer.static_length, keys, values)


class RetrievalView(SparseViewMixin, BufferedCache):
    """A sparse, compacted view of a :class:`RetrievalCache` for level-1 (self-speculative) drafting.

    ``get_seq_length()`` is the *true* length; ``get_query_offset()``/``get_mask_sizes()`` the compacted *visible* one,
    so the causal mask lines up with the keys ``update`` returns (post-RoPE: true positions). Forwards pass explicit
    ``position_ids`` and ``attention_mask=None``. ``extra_capacity``: room per layer until the next selection.
    """

    def __init__(self, source, indices: list[torch.Tensor], extra_capacity: int) -> None:
        layers = []
        for layer, idx in zip(source.layers, indices, strict=True):
            # whole chunks of slots, as the full cache's
            layers.append(ViewLayer(layer.buffer, idx, extra_capacity, source.chunk_size))
        super().__init__(layers=layers)
        self.source = source
        self.source_length = source.get_seq_length()
        self.capacity = layers[0].buffer.capacity
