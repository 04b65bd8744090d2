"""Sparse views of a ``RetrievalCache``, what the level-1 forwards attend to: per layer and KV head, the tokens a
selection chose, then the full cache's tokens appended since, then drafts (which never enter the full cache)."""

from __future__ import annotations

import torch

from ..kernels.retrieval import gather_kv_into
from .base import BufferedCache, BufferedLayer
from .buffers import KVBuffer
from .offload import HostKVBuffer
from .slots import SlotMask


def gather_selection(buffer: KVBuffer, source: KVBuffer, indices: torch.Tensor, at: int = 0) -> int:
    """Gather full-cache storage ``source`` at slots ``indices`` ``[B, H_kv, S]`` into ``buffer[at : at + S]``;
    returns ``S``.

    In place (:func:`~hf_triforce.kernels.retrieval.gather_kv_into`); an offloaded ``source`` copies the selected tokens
    to the device first (:meth:`~hf_triforce.caches.offload.HostKVBuffer.gather`).
    """
    selected = indices.shape[-1]
    buffer.reserve(at + selected, source.like())
    buffer.length = at + selected
    keys_out, values_out = buffer.keys[:, :, at:], buffer.values[:, :, at:]
    if isinstance(source, HostKVBuffer):
        keys, values = source.gather(indices)
        keys_out.copy_(keys)
        values_out.copy_(values)
    else:
        gather_kv_into(source.keys, source.values, indices, keys_out, values_out)
    return selected


class ViewLayer(BufferedLayer):
    """One layer of a sparse view: the tokens a selection gathered (:meth:`gather`), then room for ``extra_capacity``
    more until the next selection. Its slots are compacted: queries and keys count from 0."""

    def __init__(self, extra_capacity: int, align: int = 1) -> None:
        super().__init__(KVBuffer(0, align))
        self.extra_capacity = extra_capacity

    def gather(self, source: KVBuffer, indices: torch.Tensor, start: int = 0) -> None:
        """Hold the tokens at ``indices`` ``[B, H_kv, S]`` (slots of ``source``) from slot 0 on, ``start`` the position
        of slot 0; in the storage held while it has room for them and ``extra_capacity`` more (fresh memory at every
        selection was slow to fault in on the CPU), else in new storage, the old one dropped first."""
        wanted = indices.shape[-1] + self.extra_capacity
        if self.buffer.storage[0] is None or self.buffer.storage[0].shape[-2] < wanted:
            self.buffer = KVBuffer(wanted, self.buffer.align)
            self.keys = self.values = None
        self.static_length = gather_selection(self.buffer, source, indices)
        self.lazy_initialization(self.buffer.keys, self.buffer.values)
        self.start = start


class SlidingViewLayer(ViewLayer):
    """A sliding layer's share of a view: its most recent tokens from position ``start`` on, contiguous, so its mask
    is the model's sliding-window mask at true positions (``get_mask_sizes`` answers with the offset ``start``)."""

    is_sliding = True


def _slots_of(layer: BufferedLayer, indices: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The slots of ``layer`` holding the tokens at ``indices``, and the position of the view's first slot: a sliding
    layer's view holds its last tokens, contiguous, at their positions; a full layer's, compacted from 0."""
    if layer.is_sliding:
        return layer.local(indices), layer.get_seq_length() - indices.shape[-1]
    return indices, 0


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
        layer = self.layers[layer_idx]
        return layer.start + layer.buffer.length  # compacted (start 0), or true positions for a sliding layer's

    def tail_length(self) -> int | None:
        """Tokens of the full cache appended since the selection; ``None`` once a sliding layer no longer holds them
        (its window moved past the selection: the view is selected again)."""
        if not all(layer.holds(self.source_length) for layer in self.source.layers):
            return None
        return self.source.get_seq_length() - self.source_length

    def sync(self, slots: SlotMask | None = None) -> list[tuple[int, torch.Tensor, int]]:
        """Drop drafted tokens and copy the full cache's tokens added since the selection (exact KV).

        A batch's (``slots``) sliding layer packs its rows after each round, so the view copies its last slots again,
        as many as the view held and the tail (fewer if it holds fewer, after invalid ones); returns, per such layer,
        ``(layer_idx, validity [B, S + T], T)``: ``T`` tail slots covered.
        """
        start, tail, packed = self.source_length, self.source.get_seq_length() - self.source_length, []
        for i, (view_layer, layer) in enumerate(zip(self.layers, self.source.layers, strict=True)):
            if slots is None or not layer.is_sliding or layer.packed is None:
                keys, values = layer.read_from(start)
                view_layer.buffer.write(view_layer.static_length, keys, values)
                continue
            span = view_layer.static_length + tail
            count = min(span, layer.buffer.length)
            keys, values = layer.buffer.read(layer.buffer.length - count, layer.buffer.length)
            view_layer.buffer.write(span - count, keys, values)
            valid = layer.validity(slots)[:, layer.buffer.length - count :]
            packed.append((i, torch.cat([valid.new_zeros(valid.shape[0], span - count), valid], dim=1), tail))
        return packed


class RetrievalView(SparseViewMixin, BufferedCache):
    """A sparse, compacted view of a :class:`RetrievalCache` for level-1 (self-speculative) drafting.

    ``get_seq_length()`` is the *true* length; ``get_query_offset()``/``get_mask_sizes()`` the compacted *visible* one,
    so the causal mask lines up with the keys ``update`` returns (post-RoPE: true positions). Forwards pass explicit
    ``position_ids`` and ``attention_mask=None``. ``extra_capacity``: room per layer until the next selection.
    """

    def __init__(self, source, indices: list[torch.Tensor], extra_capacity: int) -> None:
        kinds = [(SlidingViewLayer, 1) if s.is_sliding else (ViewLayer, source.chunk_size) for s in source.layers]
        super().__init__(layers=[kind(extra_capacity, align) for kind, align in kinds])
        self.source = source
        self.refresh(indices)

    def refresh(self, indices: list[torch.Tensor]) -> None:
        """Select again: the tokens at per-layer ``indices`` ``[B, H_kv, S]``, in the storage the view holds
        (:meth:`ViewLayer.gather`)."""
        for view_layer, layer, idx in zip(self.layers, self.source.layers, indices, strict=True):
            view_layer.gather(layer.buffer, *_slots_of(layer, idx))
        self.source_length = self.source.get_seq_length()
