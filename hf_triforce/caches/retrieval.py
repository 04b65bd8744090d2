"""``RetrievalCache``: the target's full KV cache plus chunk summaries, serving sparse retrieval views."""

from __future__ import annotations

import torch

from ..errors import InternalError
from ..kernels.retrieval import chunk_key_scores, chunk_scores
from .base import BufferedCache, BufferedLayer
from .buffers import KVBuffer
from .offload import DeviceWindow, HostKVBuffer, Transfers
from .selection import (
    LOOKAHEAD,
    keys_scores,
    nominate_chunks,
    outside_window,
    ranks_every_chunk,
    rescore,
    select_token_indices,
    window_layout,
    with_key_scores,
)
from .sliding import SlidingLayer
from .slots import SlotMask, gathered_validity
from .summaries import ChunkSummaries
from .view import RetrievalView


class RetrievalLayer(BufferedLayer):
    """One layer of the full cache; its chunk means live in the cache's
    :class:`~hf_triforce.caches.summaries.ChunkSummaries`."""

    def __init__(self, capacity: int = 0, chunk_size: int = 8, buffer: KVBuffer | None = None) -> None:
        super().__init__(KVBuffer(capacity, align=chunk_size) if buffer is None else buffer)
        self.chunk_size = chunk_size
        self.share_summaries(ChunkSummaries([self], chunk_size), 0)

    def load(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int) -> None:
        """Start from a caller's ``[B, H_kv, length, D]`` keys and values."""
        if key_states.shape[-2] != length:
            raise InternalError("a full layer is loaded with every token")
        self.update(key_states, value_states)

    def share_summaries(self, summaries: ChunkSummaries, index: int) -> None:
        """Keep this layer's chunk means in ``summaries`` (the cache's, for all its layers) as layer ``index``."""
        self._store, self._index = summaries, index

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._store.crop(self._index, self.buffer.length // self.chunk_size)

    def reset(self) -> None:
        self.buffer.length = 0
        self._store.crop(self._index, 0)

    def summaries(self) -> torch.Tensor:
        """``[B, H_kv, L // chunk_size, D]`` chunk means, computing only chunks completed since the last call."""
        return self._store.layer(self._index)


class RetrievalCache(BufferedCache):
    """The target model's full KV cache, with chunk summaries for query-aware retrieval.

    ``DynamicCache``-like (appends, negative ``crop``) over preallocated buffers of ``capacity`` slots; ``offload_to``
    (the model's device) keeps keys and values in host memory (:mod:`~hf_triforce.caches.offload`). ``windows``: each
    layer's sliding window (``None``: full attention); a sliding layer is a
    :class:`~hf_triforce.caches.sliding.SlidingLayer` (its window and ``round_slots`` more; no chunk summaries; it
    stays on the device when the full layers are offloaded).

    Example:
        >>> cache = RetrievalCache(num_layers=2, chunk_size=8, capacity=64)
        >>> _ = cache.update(torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), layer_idx=0)
        >>> cache.layers[0].summaries().shape
        torch.Size([1, 2, 2, 16])
    """

    def __init__(
        self,
        num_layers: int,
        chunk_size: int = 8,
        capacity: int = 0,
        offload_to: torch.device | None = None,
        windows: list[int | None] | None = None,
        round_slots: int = 0,
    ) -> None:
        self.transfers = None if offload_to is None else Transfers()
        windows = [None] * num_layers if windows is None else list(windows)
        full = [i for i, window in enumerate(windows) if window is None]
        buffers = {i: None for i in full}
        if offload_to is not None and full:
            host = [HostKVBuffer(capacity, chunk_size, n, offload_to, self.transfers) for n in range(len(full))]
            device_window = DeviceWindow(host, offload_to)
            for i, buffer in zip(full, host, strict=True):
                buffer.window, buffers[i] = device_window, buffer
        layers = [
            RetrievalLayer(capacity, chunk_size, buffers[i]) if w is None else SlidingLayer(w, round_slots)
            for i, w in enumerate(windows)
        ]
        self.full_layers = [layers[i] for i in full]
        self.summaries = ChunkSummaries(self.full_layers, chunk_size)  # every full layer's chunk means, side by side
        for n, layer in enumerate(self.full_layers):
            layer.share_summaries(self.summaries, n)
        super().__init__(layers=layers)
        self.chunk_size = chunk_size

    def load(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Layer ``layer_idx`` starts from a caller's keys and values: the last ``keys.shape[2]`` of ``length`` tokens
        (all of them for a full layer)."""
        self.layers[layer_idx].load(keys, values, length)

    def record_rounds(self, on: bool) -> None:
        """Within a call's rounds (``on``) sliding layers keep every token until :meth:`trim`; after, an ``update``
        keeps their window only (a later plain ``generate()``)."""
        for layer in self.layers:
            if layer.is_sliding:
                layer.record_past = on

    def trim(self, slots: SlotMask | None = None) -> None:
        """After a verification's crop: each sliding layer drops the tokens no next query's window reaches (with
        ``slots``, a batch: each row keeps its last tokens, packed by
        :meth:`~hf_triforce.caches.sliding.SlidingLayer.pack_rows`)."""
        for layer in self.layers:
            if layer.is_sliding and layer.buffer.length:
                if slots is None:
                    layer.trim(layer.get_seq_length() - (layer.window - 1))
                else:
                    layer.pack_rows(slots)

    def validity(self, layer_idx: int, slots: SlotMask) -> torch.Tensor:
        """``[B, held]`` whether each slot layer ``layer_idx`` holds is a real token of its row (a batch's ``slots``:
        a full layer's are the batch's, a sliding layer's its own)."""
        layer = self.layers[layer_idx]
        return layer.validity(slots) if layer.is_sliding else slots.valid

    def gathered_validity(self, indices: list[torch.Tensor], slots: SlotMask) -> list[torch.Tensor]:
        """Per layer ``[B, H_kv, S]``: whether the tokens a selection chose (``indices[l]``, ``[B, H_kv, S]``) are
        real tokens of their row."""
        return [
            gathered_validity(self.validity(i, slots), layer.local(idx))
            for i, (layer, idx) in enumerate(zip(self.layers, indices, strict=True))
        ]

    def index(self, layer_idx: int, slots: SlotMask) -> torch.Tensor:
        """``[B, held]`` each slot's index as plain ``generate()`` lays the row out (what sliding windows count)."""
        layer = self.layers[layer_idx]
        return layer.index(slots) if layer.is_sliding else slots.plain_index()

    def select(
        self,
        queries: list[torch.Tensor],
        budget: int,
        recent_window: int,
        slots: SlotMask | None = None,
        rescore_candidates: int = 0,
        windows: list[int | None] | None = None,
    ) -> list[torch.Tensor]:
        """Per-layer token indices ``[B, H_kv, S]`` of the best chunks for ``queries[l]`` ``[B, H_q, D]``.

        With ``slots`` (a batch) chunks of padding or holes lose to real ones and each row's first real chunk is its
        sink; ``rescore_candidates``: :func:`~hf_triforce.caches.selection.rescore`; ``windows``: each layer's sliding
        window (:func:`~hf_triforce.caches.selection.window_layout`). Without ``slots`` all layers are ranked at once.
        """
        windows = [None] * len(self.layers) if windows is None else windows
        indices = [layer.recent_indices(budget) if layer.is_sliding else None for layer in self.layers]
        full = [i for i, layer in enumerate(self.layers) if not layer.is_sliding]
        settings = (budget, recent_window, slots, rescore_candidates)
        if slots is None and self._stackable([queries[i] for i in full], budget):
            chosen = self._select_stacked(queries, budget, recent_window, rescore_candidates, windows, full)
        else:
            chosen = [self.select_layer(i, queries[i], *settings, window=windows[i]) for i in full]
        for i, layer_indices in zip(full, chosen, strict=True):
            indices[i] = layer_indices
        return indices

    def _stackable(self, queries: list[torch.Tensor], budget: int) -> bool:
        """Whether every full layer has chunks to choose from, holds as many tokens and lives where the first does
        (:meth:`~hf_triforce.caches.summaries.ChunkSummaries.one_place`), and the queries share shape, dtype, device."""
        if self.get_seq_length() <= budget or not self.summaries.one_place():
            return False
        one_length = len({layer.buffer.length for layer in self.full_layers}) == 1
        return one_length and len({(query.shape, query.dtype, query.device) for query in queries}) == 1

    def _select_stacked(
        self,
        queries: list[torch.Tensor],
        budget: int,
        recent_window: int,
        rescore_candidates: int,
        windows: list[int | None],
        layer_ids: list[int],
    ) -> list[torch.Tensor]:
        """:meth:`select` for the ``L`` full layers ``layer_ids`` at once, the same indices as layer by layer: one
        top-k over stacked ``[L * B, H_kv, C]`` scores (a selection's small operations cost more than their
        arithmetic). Only the keys' reading (:meth:`_rescore_stacked`) stays per layer; a full layer of a model's
        sliding layer (a caller's cache that kept every token) gets its own recent window."""
        length, queries = self.get_seq_length(), [queries[i] for i in layer_ids]
        layout = (length, self.chunk_size, budget, recent_window)
        kinds = [window_layout(*layout, windows[i]) for i in layer_ids]
        if ranks_every_chunk(*layout, rescore_candidates):  # every chunk ranked by its keys, read in place per layer
            settings = (budget, recent_window, None, rescore_candidates, length)
            per_layer = zip(layer_ids, queries, kinds, strict=True)
            scores = torch.cat([self.chunk_ranking(i, q, *settings, kind[1]) for i, q, kind in per_layer])
        else:
            scores = _outside_windows(self._stacked_chunk_scores(queries), kinds, self.chunk_size)
            if rescore_candidates:
                scores = self._rescore_stacked(scores, queries, layout, rescore_candidates)
        per_layer = scores.unflatten(0, (len(queries), -1))
        indices: list[torch.Tensor] = [None] * len(queries)
        for recent in {recent for recent, _ in kinds}:  # one indexing per recent window (one without sliding layers)
            layers = [i for i, (r, _) in enumerate(kinds) if r == recent]
            chosen = select_token_indices(per_layer[layers].flatten(0, 1), *layout[:3], recent, LOOKAHEAD)
            for i, layer_indices in zip(layers, chosen.unflatten(0, (len(layers), -1)).unbind(0), strict=True):
                indices[i] = layer_indices
        return indices

    def _stacked_chunk_scores(self, queries: list[torch.Tensor]) -> torch.Tensor:
        """``[L * B, H_kv, C]`` chunk-mean scores of the ``L`` full layers' ``queries``: one scoring of stacked
        summaries."""
        n = min(layer.summaries().shape[2] for layer in self.full_layers)  # computes what each layer lacks
        summaries = self.summaries.stacked(n)
        if summaries is None:  # each layer got its own tensor before they were all in one place
            summaries = torch.stack([layer.summaries()[:, :, :n] for layer in self.full_layers]).flatten(0, 1)
        return chunk_scores(torch.stack(queries).flatten(0, 1), summaries)

    def _rescore_stacked(
        self, scores: torch.Tensor, queries: list[torch.Tensor], layout: tuple[int, int, int, int], factor: int
    ) -> torch.Tensor:
        """:func:`~hf_triforce.caches.selection.rescore` of stacked ``scores`` ``[L * B, H_kv, C]`` (``layout``: length,
        chunk size, budget, recent window): one top-k of the nominees, each layer's keys read for its own."""
        nominated = nominate_chunks(scores, *layout, factor)  # [L * B, H_kv, F]
        layers, split = self.full_layers, nominated.unflatten(0, (len(self.full_layers), -1)).unbind(0)
        per_layer = zip(queries, layers, split, strict=True)
        by_keys = [
            chunk_key_scores(q, *layer.buffer.gather_chunk_keys(n, self.chunk_size), self.chunk_size)
            for q, layer, n in per_layer
        ]
        return with_key_scores(scores, nominated, torch.cat(by_keys))

    def select_layer(
        self,
        layer_idx: int,
        query: torch.Tensor,
        budget: int,
        recent_window: int,
        slots: SlotMask | None = None,
        rescore_candidates: int = 0,
        window: int | None = None,
    ) -> torch.Tensor:
        """Token indices ``[B, H_kv, S]`` of layer ``layer_idx``'s best chunks: one layer of :meth:`select`.

        ``query`` may hold several queries per query head (``[B, H_q * m, D]``, grouped by KV head): the summaries sum
        them, the keys take the largest logit of any. A sliding layer's view is its most recent tokens (at most
        ``budget``): it holds only its window.
        """
        if self.layers[layer_idx].is_sliding:
            return self.layers[layer_idx].recent_indices(budget)
        length = self.get_seq_length()
        recent, start = window_layout(length, self.chunk_size, budget, recent_window, window)
        settings = (budget, recent_window, slots, rescore_candidates, length, start)
        scores = self.chunk_ranking(layer_idx, query, *settings)
        return select_token_indices(scores, length, self.chunk_size, budget, recent, LOOKAHEAD)

    def chunk_ranking(
        self,
        layer_idx: int,
        query: torch.Tensor,
        budget: int,
        recent_window: int,
        slots: SlotMask | None = None,
        rescore_candidates: int = 0,
        length: int | None = None,
        window_start: int = 0,
    ) -> torch.Tensor:
        """``[B, H_kv, C]`` scores :meth:`select_layer` ranks layer ``layer_idx``'s chunks by, before the look-ahead.

        ``C = 0`` when ``length <= budget`` (every token kept). Chunks that start before ``window_start`` score
        ``-inf``, also before the keys re-score the nominees.

        Example:
            >>> cache = RetrievalCache(num_layers=1, chunk_size=8)
            >>> _ = cache.update(torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16), layer_idx=0)
            >>> cache.chunk_ranking(0, torch.randn(1, 4, 16), budget=24, recent_window=8).shape
            torch.Size([1, 2, 5])
        """
        layer = self.layers[layer_idx]
        length = self.get_seq_length() if length is None else length
        layout = (length, self.chunk_size, budget, recent_window)
        if length <= budget:  # everything is kept; only the [B, H_kv] shape matters
            kv_heads = layer.buffer.like().shape[1] if layer.is_initialized else 1
            return query.new_zeros(query.shape[0], kv_heads, 0)
        if slots is None and ranks_every_chunk(*layout, rescore_candidates):
            scores = keys_scores(query, layer.buffer.read_keys(0, length), length, self.chunk_size)  # no summaries
            return outside_window(scores, self.chunk_size, window_start)
        scores = chunk_scores(query, layer.summaries())
        if slots is not None:
            scores = _per_row_sinks(scores, slots, self.chunk_size)
        scores = outside_window(scores, self.chunk_size, window_start)
        if rescore_candidates:
            scores = rescore(scores, query, layer.buffer, *layout, rescore_candidates)
        return scores

    def keep_path(self, start: int, nodes: torch.Tensor) -> None:
        """Of the slots from ``start`` on (a verified token tree), keep those at offsets ``nodes`` ``[n]`` (the accepted
        path, root first), moved to ``start .. start + n``. Keys keep their positions (a node's depth, now the path's).

        Example:
            >>> cache = RetrievalCache(num_layers=1, chunk_size=2)
            >>> _ = cache.update(torch.arange(5.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1), 0)
            >>> cache.keep_path(2, torch.tensor([0, 2]))  # a root at slot 2, its accepted child at slot 4
            >>> cache.layers[0].keys[0, 0, :, 0].tolist()
            [0.0, 1.0, 2.0, 4.0]
        """
        for layer in self.layers:
            length = layer.get_seq_length()
            if torch.equal(nodes.cpu(), torch.arange(nodes.shape[0])):  # a chain: the leading slots, in place
                layer.crop(start + nodes.shape[0] - length)
                continue
            keys, values = layer.read_from(start)
            keys, values = keys.index_select(2, nodes.to(keys.device)), values.index_select(2, nodes.to(keys.device))
            layer.crop(start - length)
            layer.update(keys, values)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the batch rows at ``rows`` (``[B']`` indices) remain."""
        self.summaries.keep_rows(rows)
        for layer in self.layers:  # full and sliding alike
            layer.keep_rows(rows)

    def sparse_view(self, indices: list[torch.Tensor], extra_capacity: int) -> RetrievalView:
        """A :class:`~hf_triforce.caches.view.RetrievalView` of the tokens at ``indices``, ``extra_capacity`` more."""
        return RetrievalView(self, indices, extra_capacity)


def _per_row_sinks(scores: torch.Tensor, slots: SlotMask, chunk_size: int) -> torch.Tensor:
    """``[B, H_kv, C]`` scores with chunks of no real token at ``-inf`` and each row's first real chunk at ``+inf``."""
    real = slots.chunk_mask(chunk_size)[:, None, : scores.shape[-1]]
    scores = scores.float().masked_fill(~real, float("-inf"))
    first = slots.first_chunk(chunk_size).clamp(max=scores.shape[-1] - 1)
    return scores.scatter(-1, first[:, None, None].expand(-1, scores.shape[1], 1), float("inf"))


def _outside_windows(scores: torch.Tensor, kinds: list[tuple[int, int]], chunk_size: int) -> torch.Tensor:
    """Stacked ``[L * B, H_kv, C]`` scores with each layer's chunks before its window start (``kinds``) at ``-inf``."""
    if all(start == 0 for _, start in kinds):
        return scores
    per_layer = scores.unflatten(0, (len(kinds), -1))
    masked = [outside_window(layer, chunk_size, start) for layer, (_, start) in zip(per_layer, kinds, strict=True)]
    return torch.stack(masked).flatten(0, 1)
