"""Re-selecting a retrieval view inside every level-1 forward: in each layer, the chunks that layer's own query
ranks in replace the ones it ranks out, in place, before the layer attends.

A :class:`~hf_triforce.caches.view.RetrievalView` is chosen with the query of the newest cached token and then
serves the level-1 steps of one or more rounds. The query moves on at every step (a copy reads forward through
its source; a new sentence attends elsewhere), and a stale choice misses what the next token needs; a query one
position old already misses some of it. :class:`ChunkSwapper` ranks one layer's chunks again for the queries
that layer computes (``TriForceConfig.step_selection``: level 1's direct forward calls
:meth:`ChunkSwapper.reselect_layer` between a layer's query projection and its attention) and does it
incrementally: the view keeps its sink, recent tokens and tail; only the middle chunks whose rank changed are
copied. What it buys and costs: ``benchmarks/results/step-selection-heldout.md``.
"""

from __future__ import annotations

import torch

from .selection import _layout


class ChunkSwapper:
    """Keeps which chunk each middle slot of a view holds, and swaps in the chunks a new query ranks higher.

    The view's gathered tokens are, per layer and KV head, the sink chunk, ``k`` middle chunks and the recent tokens
    (:func:`~hf_triforce.caches.selection.select_token_indices`). :meth:`reselect_layer` ranks one layer's chunks of
    the view's source again (:meth:`reselect`: every layer's), as the selection did (same budget, recent window,
    look-ahead and re-scoring), at the length the view was selected at, and copies the chunks that entered the top
    ``k`` over those that left. The view's set of chunks is then exactly that of a fresh selection for the new
    queries; only the order of its slots differs, which attention does not see.

    Args:
        view: the :class:`~hf_triforce.caches.view.RetrievalView` (batch 1) to keep re-selecting.
        indices: the per-layer ``[1, H_kv, S]`` token indices it was gathered from.
        budget, recent_window, lookahead, rescore_candidates: the selection's settings
            (:meth:`~hf_triforce.caches.retrieval.RetrievalCache.select`).

    Example:
        >>> swapper = ChunkSwapper(view, indices, 512, 64, 1, 0)  # doctest: +SKIP
        >>> swapper.reselect_layer(0, query)  # layer 0's [1, H_q, D] query -> chunks copied  # doctest: +SKIP
        3
    """

    def __init__(
        self, view, indices: list[torch.Tensor], budget: int, recent_window: int, lookahead: int, rescore_candidates
    ) -> None:
        self.view, self.source, self.length = view, view.source, view.source_length
        self.settings = (budget, recent_window, lookahead, rescore_candidates)
        c = self.source.chunk_size
        self.k = max(0, _layout(self.length, c, budget, recent_window)[2])
        self.chunks = self._middle_chunks(indices)  # [L, H_kv, k]

    def _middle_chunks(self, indices: list[torch.Tensor]) -> torch.Tensor:
        c = self.source.chunk_size
        return torch.stack([idx[0, :, c : c * (self.k + 1) : c] // c for idx in indices])

    def reselect(self, queries: list[torch.Tensor]) -> int:
        """Rank the chunks for per-layer ``[1, H_q, D]`` ``queries`` and swap the view's; returns chunks copied."""
        return sum(self.reselect_layer(i, query) for i, query in enumerate(queries))

    def reselect_layer(self, layer: int, query: torch.Tensor) -> int:
        """Rank layer ``layer``'s chunks for ``query`` (``[1, H_q, D]``, or ``[1, H_q * m, D]`` for ``m`` queries
        per head, see :meth:`~hf_triforce.caches.retrieval.RetrievalCache.select_layer`) and swap that layer's
        chunks; returns chunks copied. Level 1's direct forward calls it inside each layer, with the layer's own
        query, just before attention."""
        budget, window, lookahead, factor = self.settings
        indices = self.source.select_layer(layer, query, budget, window, lookahead, None, factor, self.length)
        return self._swap(layer, self._middle_chunks([indices])[0])

    def _swap(self, layer: int, new: torch.Tensor) -> int:
        """Copy the chunks of ``new`` (``[H_kv, k]``) that layer ``layer`` lacks over those it no longer needs."""
        heads, k = new.shape
        stride = self.length // self.source.chunk_size + 1
        offset = torch.arange(heads, device=new.device).view(heads, 1) * stride
        old_flat, new_flat = (self.chunks[layer] + offset).flatten(), (new + offset).flatten()
        leaving = (~torch.isin(old_flat, new_flat)).nonzero()[:, 0]  # slots, in head order
        if leaving.numel() == 0:
            return 0
        arriving = new_flat[~torch.isin(new_flat, old_flat)] % stride  # as many per head, same order
        self.chunks[layer].view(-1)[leaving] = arriving
        self._copy(layer, leaving // k, leaving % k, arriving)
        return int(leaving.numel())

    def _copy(self, layer: int, head: torch.Tensor, slot: torch.Tensor, chunk: torch.Tensor) -> None:
        """Copy chunks ``chunk`` of the source into middle slots ``slot`` of KV heads ``head`` (all ``[n]``)."""
        c = self.source.chunk_size
        offsets = torch.arange(c, device=chunk.device)
        target = ((slot + 1) * c)[:, None] + offsets  # slot s sits after the sink chunk
        tokens = (chunk * c)[:, None] + offsets
        view, full = self.view.layers[layer].buffer, self.source.layers[layer].buffer
        view.copy_tokens(full, head.repeat_interleave(c), target.flatten(), tokens.flatten())
