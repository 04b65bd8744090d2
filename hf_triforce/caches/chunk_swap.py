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

from .selection import _layout, top_middle_chunks

HOLD = 0.25
"""The ``hold`` level 1's :class:`ChunkSwapper` uses: a held chunk stays while it ranks within the top ``1.25 k``.
On the tune split's teacher-forced oracle (``benchmarks/results/step-selection-oracle-tune.md``, ``peak-sticky-now``)
it keeps level 1's agreement (worst depth 0.972 / 0.988 at 1/16 / 1/8, against 0.968 / 0.984 following the top
``k``) and copies fewer chunks."""


class ChunkSwapper:
    """Keeps which chunk each middle slot of a view holds, and swaps in the chunks a new query ranks higher.

    The view's gathered tokens are, per layer and KV head, the sink chunk, ``k`` middle chunks and the recent tokens
    (:func:`~hf_triforce.caches.selection.select_token_indices`). :meth:`reselect_layer` ranks one layer's chunks of
    the view's source again (:meth:`reselect`: every layer's), as the selection did (same budget, recent window,
    look-ahead and re-scoring), at the length the view was selected at, and copies the chunks that entered the top
    ``k`` over those that left. The view's set of chunks is then exactly that of a fresh selection for the new
    queries; only the order of its slots differs, which attention does not see. With ``hold > 0`` a held chunk
    stays while it ranks within the top ``k + r`` (``r = int(hold * k)``) and only the best of the others enter:
    fewer chunks are copied per step.

    Args:
        view: the :class:`~hf_triforce.caches.view.RetrievalView` (batch 1) to keep re-selecting.
        indices: the per-layer ``[1, H_kv, S]`` token indices it was gathered from.
        budget, recent_window, lookahead, rescore_candidates: the selection's settings
            (:meth:`~hf_triforce.caches.retrieval.RetrievalCache.select`).
        hold: how far past the ``k``-th rank a held chunk stays, as a fraction of ``k`` (0: the view follows the top
            ``k``; level 1 uses :data:`HOLD`).

    Example:
        >>> swapper = ChunkSwapper(view, indices, 512, 64, 1, 0)  # doctest: +SKIP
        >>> swapper.reselect_layer(0, query)  # layer 0's [1, H_q, D] query -> chunks copied  # doctest: +SKIP
        3
    """

    def __init__(
        self,
        view,
        indices: list[torch.Tensor],
        budget: int,
        recent_window: int,
        lookahead: int,
        rescore_candidates: int,
        hold: float = 0.0,
    ) -> None:
        self.view, self.source, self.length = view, view.source, view.source_length
        self.settings = (budget, recent_window, lookahead, rescore_candidates)
        c = self.source.chunk_size
        self.k = max(0, _layout(self.length, c, budget, recent_window)[2])
        self.hold_ranks = int(hold * self.k)
        chunks = torch.stack([idx[0, :, c : c * (self.k + 1) : c] // c for idx in indices])  # [L, H_kv, k]
        layers, heads = chunks.shape[:2]
        self.held = torch.zeros(layers, heads, self.length // c + 1, dtype=torch.bool, device=chunks.device)
        self.held.scatter_(2, chunks, True)  # [L, H_kv, C]: whether a chunk is in the view
        self.slot_of = torch.zeros_like(self.held, dtype=torch.long)  # [L, H_kv, C]: the slot of a held chunk
        self.slot_of.scatter_(2, chunks, torch.arange(self.k, device=chunks.device).expand_as(chunks))

    @property
    def chunks(self) -> torch.Tensor:
        """``[L, H_kv, k]``: the chunk each middle slot holds (from :attr:`held` and :attr:`slot_of`)."""
        layers, heads = self.held.shape[:2]
        ids = self.held.nonzero()[:, 2].view(layers, heads, self.k)  # each (layer, head) holds k chunks
        return torch.empty_like(ids).scatter_(2, self.slot_of.gather(2, ids), ids)

    def reselect(self, queries: list[torch.Tensor]) -> int:
        """Rank the chunks for per-layer ``[1, H_q, D]`` ``queries`` and swap the view's; returns chunks copied."""
        return sum(self.reselect_layer(i, query) for i, query in enumerate(queries))

    def reselect_layer(self, layer: int, query: torch.Tensor) -> int:
        """Rank layer ``layer``'s chunks for ``query`` (``[1, H_q, D]``, or ``[1, H_q * m, D]`` for ``m`` queries
        per head, see :meth:`~hf_triforce.caches.retrieval.RetrievalCache.select_layer`) and swap that layer's
        chunks; returns chunks copied. Level 1's direct forward calls it inside each layer, with the layer's own
        query, just before attention."""
        budget, window, lookahead, factor = self.settings
        scores = self.source.chunk_ranking(layer, query, budget, window, None, factor, self.length)
        return self._swap(layer, self._kept(layer, scores[0]))

    def _kept(self, layer: int, scores: torch.Tensor) -> torch.Tensor:
        """``[H_kv, C]``: the middle chunks layer ``layer`` keeps for chunk ``scores`` ``[H_kv, C]``: the top ``k``,
        or (``hold_ranks = r > 0``) its held chunks still in the top ``k + r`` and the best others."""
        budget, window, lookahead, _ = self.settings
        layout = (self.length, self.source.chunk_size, budget, window, lookahead, self.hold_ranks)
        order = top_middle_chunks(scores[None], *layout)[0]  # best first
        kept = torch.arange(order.shape[-1], device=order.device) < self.k
        if self.hold_ranks:
            held = self.held[layer].gather(1, order)
            room = self.k - held.sum(1, keepdim=True)
            kept = held | (~held & ((~held).cumsum(1) <= room))
        return torch.zeros_like(self.held[layer]).scatter_(1, order, kept.expand_as(order))

    def _swap(self, layer: int, keep: torch.Tensor) -> int:
        """Copy the chunks ``keep`` (``[H_kv, C]``) marks that layer ``layer`` lacks over those it no longer needs."""
        arriving = keep & ~self.held[layer]
        if not bool(arriving.any()):
            return 0
        head, chunk = arriving.nonzero(as_tuple=True)  # head order; each head gains as many chunks as it loses
        slot = self.slot_of[layer][self.held[layer] & ~keep]  # the leaving chunks' slots, in the same head order
        self.slot_of[layer][head, chunk] = slot
        self.held[layer] = keep
        self._copy(layer, head, slot, chunk)
        return int(chunk.numel())

    def _copy(self, layer: int, head: torch.Tensor, slot: torch.Tensor, chunk: torch.Tensor) -> None:
        """Copy chunks ``chunk`` of the source into middle slots ``slot`` of KV heads ``head`` (all ``[n]``)."""
        view, full = self.view.layers[layer].buffer, self.source.layers[layer].buffer
        view.copy_chunks(full, head, slot + 1, chunk, self.source.chunk_size)  # slot s sits after the sink chunk
