"""Sparse views of a ``RetrievalCache``: the gathered tokens of a selection, then the tail since, then drafts.

A view is what the level-1 forwards attend to: per layer and KV head, the tokens a selection chose (keys
post-RoPE, so they keep their true positions), followed by the full cache's tokens appended since the
selection, followed by drafted tokens (which never enter the full cache). :class:`RetrievalView` grows; the
fixed-capacity form for CUDA graphs is :class:`~hf_triforce.caches.static_view.StaticRetrievalView`; both share
:class:`SparseViewMixin` and :func:`gather_selection`.
"""

from __future__ import annotations

import torch

from ..kernels.retrieval import gather_kv_into
from .base import BufferedCache, BufferedLayer
from .buffers import KVBuffer
from .offload import HostKVBuffer


def gather_selection(buffer: KVBuffer, source: KVBuffer, indices: torch.Tensor) -> int:
    """Write the tokens at ``[B, H_kv, S]`` ``indices`` of the full-cache layer storage ``source`` into
    ``buffer[:S]``.

    In place, straight into the buffer's storage (one Triton launch for keys and values on CUDA, row copies on
    the CPU; see :func:`hf_triforce.kernels.retrieval.gather_kv_into`); an offloaded ``source`` copies the selected
    tokens to the device first (:meth:`~hf_triforce.caches.offload.HostKVBuffer.gather`). The buffer's length
    becomes ``S``, which is returned (a view layer's ``static_length``).
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
    """One layer of a sparse view: gathered tokens, then a tail of recent and drafted tokens.

    Args:
        source: the full-cache layer's storage.
        indices: ``[B, H_kv, S]`` token indices to gather (:func:`gather_selection`).
        extra_capacity: room for this many more tokens after the ``S`` gathered ones.
        align: the storage holds a multiple of this many slots (:class:`~hf_triforce.caches.buffers.KVBuffer`).
    """

    def __init__(self, source: KVBuffer, indices: torch.Tensor, extra_capacity: int, align: int = 1) -> None:
        super().__init__(KVBuffer(indices.shape[-1] + extra_capacity, align))
        self.static_length = gather_selection(self.buffer, source, indices)
        self.lazy_initialization(self.buffer.keys, self.buffer.values)


class SparseViewMixin:
    """Bookkeeping shared by :class:`RetrievalView` and the fixed-capacity ``StaticRetrievalView``.

    Expects ``self.layers`` (each with a ``buffer`` and a ``static_length``: the gathered tokens come
    first), ``self.source`` (the :class:`RetrievalCache`) and ``self.source_length`` (its length at the
    selection).
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
        """Tokens of the full cache appended since the selection (``source length - selection length``)."""
        return self.source.get_seq_length() - self.source_length

    def sync(self) -> None:
        """Drop drafted tokens and copy the full cache's tokens added since the selection (exact KV)."""
        start = self.source_length
        for view_layer, layer in zip(self.layers, self.source.layers, strict=True):
            keys, values = layer.buffer.read(start, layer.buffer.length)
            view_layer.buffer.write(view_layer.static_length, keys, values)


class RetrievalView(SparseViewMixin, BufferedCache):
    """A sparse, compacted view of a :class:`RetrievalCache` for level-1 (self-speculative) drafting.

    Each layer holds the gathered tokens chosen at selection time (different per KV head, keys
    post-RoPE so they keep their true positions), followed by the full cache's tokens appended since
    the selection, followed by drafted tokens. Drafted tokens never enter the full cache.

    ``get_seq_length()`` reports the *true* sequence length (the position of the next token);
    ``get_query_offset()``/``get_mask_sizes()`` report the compacted *visible* length, so the causal
    mask lines up with the keys returned by ``update``. Forwards over a view must pass explicit
    ``position_ids`` and ``attention_mask=None``.

    Args:
        source: the :class:`~hf_triforce.caches.retrieval.RetrievalCache` to gather from.
        indices: per-layer ``[B, H_kv, S]`` token indices (``RetrievalCache.select``).
        extra_capacity: room per layer for the tokens appended until the next selection and one round of drafts.
    """

    def __init__(self, source, indices: list[torch.Tensor], extra_capacity: int) -> None:
        layers = []
        for layer, idx in zip(source.layers, indices, strict=True):
            # whole chunks of slots, as the full cache's: the swapper copies chunks as rows of a chunk each
            layers.append(ViewLayer(layer.buffer, idx, extra_capacity, source.chunk_size))
        super().__init__(layers=layers)
        self.source = source
        self.source_length = source.get_seq_length()
        self.capacity = layers[0].buffer.capacity
