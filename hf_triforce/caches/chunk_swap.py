"""Re-selecting a retrieval view before every level-1 step: the chunks a newer query ranks in replace the ones it
ranks out, in place.

A :class:`~hf_triforce.caches.view.RetrievalView` is chosen with the query of the newest cached token and then
serves the level-1 steps of one or more rounds. The query moves on at every step (a copy reads forward through
its source; a new sentence attends elsewhere), and a stale choice misses what the next token needs.
:class:`ChunkSwapper` ranks the chunks again before every step (``TriForceConfig.step_selection``) and does it
incrementally: the view keeps its sink, recent tokens and tail; only the middle chunks whose rank changed are
copied. What it buys and costs: ``benchmarks/results/step-selection-heldout.md``.
"""

from __future__ import annotations

import torch

from .selection import _layout


class ChunkSwapper:
    """Keeps which chunk each middle slot of a view holds, and swaps in the chunks a new query ranks higher.

    The view's gathered tokens are, per layer and KV head, the sink chunk, ``k`` middle chunks and the recent
    tokens (:func:`~hf_triforce.caches.selection.select_token_indices`). :meth:`reselect` ranks the chunks of the
    view's source again, as the selection did (same budget, recent window, look-ahead and re-scoring), at the
    length the view was selected at, and copies the chunks that entered the top ``k`` over those that left.
    The view's set of chunks is then exactly that of a fresh selection for the new queries; only the order of
    its slots differs, which attention does not see.

    Args:
        view: the :class:`~hf_triforce.caches.view.RetrievalView` (batch 1) to keep re-selecting.
        indices: the per-layer ``[1, H_kv, S]`` token indices it was gathered from.
        budget, recent_window, lookahead, rescore_candidates: the selection's settings
            (:meth:`~hf_triforce.caches.retrieval.RetrievalCache.select`).

    Example:
        >>> swapper = ChunkSwapper(view, indices, 512, 64, 1, 0)  # doctest: +SKIP
        >>> swapper.reselect(queries)  # per-layer [1, H_q, D] queries -> chunks copied  # doctest: +SKIP
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
        budget, window, lookahead, factor = self.settings
        indices = self.source.select(queries, budget, window, lookahead, rescore_candidates=factor, length=self.length)
        return self._swap(self._middle_chunks(indices))

    def _swap(self, new: torch.Tensor) -> int:
        layers, heads, k = self.chunks.shape
        stride = self.length // self.source.chunk_size + 1
        offset = torch.arange(layers * heads, device=new.device).view(layers, heads, 1) * stride
        old_flat, new_flat = (self.chunks + offset).flatten(), (new + offset).flatten()
        leaving = (~torch.isin(old_flat, new_flat)).nonzero()[:, 0]  # slots, in (layer, head) order
        if leaving.numel() == 0:
            return 0
        arriving = new_flat[~torch.isin(new_flat, old_flat)] % stride  # as many per (layer, head), same order
        self.chunks.view(-1)[leaving] = arriving
        layer, head, slot = leaving // (heads * k), leaving // k % heads, leaving % k
        for index in layer.unique().tolist():
            here = layer == index
            self._copy(index, head[here], slot[here], arriving[here])
        return int(leaving.numel())

    def _copy(self, layer: int, head: torch.Tensor, slot: torch.Tensor, chunk: torch.Tensor) -> None:
        """Copy chunks ``chunk`` of the source into middle slots ``slot`` of KV heads ``head`` (all ``[n]``)."""
        c = self.source.chunk_size
        offsets = torch.arange(c, device=chunk.device)
        heads = head.repeat_interleave(c)
        target = ((slot + 1) * c)[:, None] + offsets  # slot s sits after the sink chunk
        source = (chunk * c)[:, None] + offsets
        view, full = self.view.layers[layer].buffer, self.source.layers[layer].buffer
        view.keys[0, heads, target.flatten()] = full.keys[0, heads, source.flatten()]
        view.values[0, heads, target.flatten()] = full.values[0, heads, source.flatten()]
