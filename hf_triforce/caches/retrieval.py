"""``RetrievalCache``: the target's full KV cache plus chunk summaries, serving sparse retrieval views."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..kernels import retrieval as kernels  # a module import: hf_triforce.kernels imports .selection back
from .buffers import KVBuffer
from .selection import chunk_means, select_token_indices


class RetrievalLayer(CacheLayerMixin):
    """One layer of the full cache: keys/values in a growable buffer and lazily computed chunk means."""

    is_sliding = False
    is_croppable = True

    def __init__(self, capacity: int = 0, chunk_size: int = 8) -> None:
        super().__init__()
        self.buffer = KVBuffer(capacity)
        self.chunk_size = chunk_size
        self._summaries: torch.Tensor | None = None
        self._n_summarized = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.buffer.append(key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.buffer.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        self.buffer.crop(tokens_to_remove)
        self.keys, self.values = (self.buffer.keys, self.buffer.values) if self.is_initialized else (None, None)
        self._n_summarized = min(self._n_summarized, self.buffer.length // self.chunk_size)

    def reset(self) -> None:
        self.buffer.length = 0
        self._n_summarized = 0

    def summaries(self) -> torch.Tensor:
        """``[B, H_kv, L // chunk_size, D]`` chunk means, computing only chunks completed since last call."""
        n = self.buffer.length // self.chunk_size
        if self._summaries is None or self._summaries.shape[2] < n:
            self._grow_summaries(n)
        if self._n_summarized < n:
            start = self._n_summarized * self.chunk_size
            new = chunk_means(self.buffer.keys[:, :, start : n * self.chunk_size], self.chunk_size)
            self._summaries[:, :, self._n_summarized : n] = new
            self._n_summarized = n
        return self._summaries[:, :, :n]

    def _grow_summaries(self, n: int) -> None:
        keys = self.buffer.keys
        previous = 0 if self._summaries is None else self._summaries.shape[2]
        capacity = max(n, 2 * previous, self.buffer.capacity // self.chunk_size + 1)  # doubling: amortized O(1)
        grown = keys.new_empty((keys.shape[0], keys.shape[1], capacity, keys.shape[-1]))
        if self._summaries is not None:
            grown[:, :, : self._n_summarized] = self._summaries[:, :, : self._n_summarized]
        self._summaries = grown


class RetrievalCache(Cache):
    """The target model's full KV cache, with chunk summaries for query-aware retrieval.

    Used as ``past_key_values`` of the target model: it behaves like ``DynamicCache`` (appends,
    negative ``crop``) but stores keys/values in preallocated buffers and keeps the mean key of every
    ``chunk_size`` tokens. :meth:`sparse_view` builds a :class:`RetrievalView` of ``budget`` tokens
    per layer and KV head for the level-1 draft forwards.

    Args:
        num_layers: decoder layers of the model.
        chunk_size: tokens per retrieval chunk.
        capacity: slots to preallocate per layer (grows if exceeded).

    Example:
        >>> cache = RetrievalCache(num_layers=2, chunk_size=8, capacity=64)
        >>> _ = cache.update(torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), layer_idx=0)
        >>> cache.layers[0].summaries().shape
        torch.Size([1, 2, 2, 16])
    """

    def __init__(self, num_layers: int, chunk_size: int = 8, capacity: int = 0) -> None:
        super().__init__(layers=[RetrievalLayer(capacity, chunk_size) for _ in range(num_layers)])
        self.chunk_size = chunk_size

    def select(self, queries: list[torch.Tensor], budget: int, recent_window: int) -> list[torch.Tensor]:
        """Per-layer token indices ``[B, H_kv, S]`` of the best chunks for ``queries[l]`` (``[B, H_q, D]``).

        Chunk scoring runs as a Triton kernel on CUDA (:func:`hf_triforce.kernels.retrieval.chunk_scores`),
        the pure-torch ``score_chunks`` otherwise; top-k and the token indices are torch either way.
        """
        length = self.get_seq_length()
        indices = []
        for layer, query in zip(self.layers, queries, strict=True):
            if length > budget:
                scores = kernels.chunk_scores(query, layer.summaries())
            else:  # everything is kept; only the [B, H_kv] shape matters (the indices are gathered per KV head)
                kv_heads = layer.buffer.keys.shape[1] if layer.is_initialized else 1
                scores = query.new_zeros(query.shape[0], kv_heads, 0)
            indices.append(select_token_indices(scores, length, self.chunk_size, budget, recent_window))
        return indices

    def sparse_view(self, indices: list[torch.Tensor], extra_capacity: int) -> RetrievalView:
        """A :class:`RetrievalView` holding the gathered tokens plus room for ``extra_capacity`` more."""
        return RetrievalView(self, indices, extra_capacity)

    def kv_nbytes(self) -> int:
        """Bytes allocated for keys and values over all layers."""
        return sum(layer.buffer.nbytes() for layer in self.layers)


def gather_selection(buffer: KVBuffer, keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> int:
    """Write the tokens at ``[B, H_kv, S]`` ``indices`` of ``[B, H_kv, L, D]`` keys/values into ``buffer[:S]``.

    In place, straight into the buffer's storage (one Triton launch for keys and values on CUDA,
    ``torch.gather`` otherwise; see :func:`hf_triforce.kernels.retrieval.gather_kv_into`); the buffer's
    length becomes ``S``, which is returned (a view layer's ``static_length``).
    """
    selected = indices.shape[-1]
    buffer.reserve(selected, keys)
    buffer.length = selected
    kernels.gather_kv_into(keys, values, indices, buffer.keys, buffer.values)
    return selected


class ViewLayer(CacheLayerMixin):
    """One layer of a sparse view: gathered tokens, then a tail of recent and drafted tokens."""

    is_sliding = False
    is_croppable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, extra_capacity: int) -> None:
        """Gather ``[B, H_kv, S]`` token ``indices`` of the full ``[B, H_kv, L, D]`` keys/values into the buffer
        (:func:`gather_selection`), with room for ``extra_capacity`` more tokens."""
        super().__init__()
        self.buffer = KVBuffer(indices.shape[-1] + extra_capacity)
        self.static_length = gather_selection(self.buffer, keys, values, indices)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return self.buffer.append(key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffer.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.buffer.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        self.buffer.crop(tokens_to_remove)


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
            keys = layer.buffer.keys[:, :, start:]
            values = layer.buffer.values[:, :, start:]
            view_layer.buffer.write(view_layer.static_length, keys, values)

    def kv_nbytes(self) -> int:
        """Bytes allocated for the view's keys and values over all layers."""
        return sum(layer.buffer.nbytes() for layer in self.layers)


class RetrievalView(SparseViewMixin, Cache):
    """A sparse, compacted view of a :class:`RetrievalCache` for level-1 (self-speculative) drafting.

    Each layer holds the gathered tokens chosen at selection time (different per KV head, keys
    post-RoPE so they keep their true positions), followed by the full cache's tokens appended since
    the selection, followed by drafted tokens. Drafted tokens never enter the full cache.

    ``get_seq_length()`` reports the *true* sequence length (the position of the next token);
    ``get_query_offset()``/``get_mask_sizes()`` report the compacted *visible* length, so the causal
    mask lines up with the keys returned by ``update``. Forwards over a view must pass explicit
    ``position_ids`` and ``attention_mask=None``.
    """

    def __init__(self, source: RetrievalCache, indices: list[torch.Tensor], extra_capacity: int) -> None:
        layers = []
        for layer, idx in zip(source.layers, indices, strict=True):
            layers.append(ViewLayer(layer.buffer.keys, layer.buffer.values, idx, extra_capacity))
        super().__init__(layers=layers)
        self.source = source
        self.source_length = source.get_seq_length()
        self.capacity = layers[0].buffer.capacity
