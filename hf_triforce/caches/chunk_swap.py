"""Re-selecting a retrieval view inside every level-1 forward: in each layer, the chunks that layer's own query
ranks in replace the ones it ranks out, in place, before the layer attends.

A :class:`~hf_triforce.caches.view.RetrievalView` is chosen with the query of the newest cached token and then
serves the level-1 steps of one or more rounds. The query moves on at every step (a copy reads forward through
its source; a new sentence attends elsewhere), and a stale choice misses what the next token needs; a query one
position old already misses some of it. :class:`ChunkSwapper` ranks one layer's chunks again for the queries
that layer computes (``TriForceConfig.step_selection``: level 1's direct forward calls
:meth:`ChunkSwapper.reselect_layer` between a layer's query projection and its attention) and does it
incrementally: the view keeps its sink, recent tokens and tail; only the middle chunks whose rank changed are
copied.

Ranking every chunk of every layer in every forward reads every key each time, more bytes than level 1's weights on
a long context. Level 1 reads far fewer: at each refresh :func:`nominate` ranks every chunk once, with the queries
of the tokens the last verification accepted (a chunk's best logit over them), and nominates ``NOMINATED x`` as
many chunks as the view has room for (their keys copied together); each step then ranks only the nominees, and
only in the later :data:`RERANKED_LAYERS` of the layers (the earlier ones keep the refresh's selection). What it
buys and costs: ``benchmarks/results/step-selection-heldout.md``.
"""

from __future__ import annotations

import torch

from ..kernels.retrieval import gather_chunks, score_all_chunk_keys
from .selection import EVERY_CHUNK, chunk_layout, select_token_indices, top_middle_chunks

HOLD = 0.25
"""The ``hold`` level 1's :class:`ChunkSwapper` uses: a held chunk stays while it ranks within the top ``1.25 k``.
On the tune split's teacher-forced oracle (``benchmarks/results/step-selection-oracle-tune.md``, ``peak-sticky-now``)
it keeps level 1's agreement (worst depth 0.972 / 0.988 at 1/16 / 1/8, against 0.968 / 0.984 following the top
``k``) and copies fewer chunks."""


NOMINATED = 4
"""How many chunks per chunk of room a refresh nominates for level 1's per-step ranking (:func:`nominate`): ``4 k``.
On the tune split's teacher-forced oracle (``benchmarks/results/step-selection-oracle-tune.md``, ``round7x4-now``
against ``round7x2-now``) 4 kept level 1's worst depth at 0.952 / 0.976 (1/16 / 1/8 of the context), 2 fell to
0.940 / 0.944."""

NOMINATION_LOOKAHEAD = 2
"""Chunks after each chunk the refresh's query ranks high that share its score when nominating: the steps of the
next rounds read forward from where that query reads."""


RERANKED_LAYERS = 0.5
"""The fraction of the decoder layers, the last ones, that level 1's steps re-rank (:func:`nominate`); the others
keep the refresh's selection. On the tune split's teacher-forced oracle
(``benchmarks/results/step-selection-oracle-tune.md``) re-ranking the later half kept level 1's worst depth at
0.964 / 0.972 (1/16 / 1/8 of the context; every layer: 0.968 / 0.984), the earlier half fell to 0.937 / 0.944,
every other layer to 0.940 / 0.937: the chunks a copy needs next move in the later layers' attention."""


def nominate(
    cache,
    queries: list[torch.Tensor],
    budget: int,
    recent_window: int,
    lookahead: int,
    factor: int = NOMINATED,
    reranked: float = RERANKED_LAYERS,
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """A refresh for level 1's per-step ranking: per layer, the view's token indices ``[1, H_kv, S]`` (the chunks
    ranked by their keys, every chunk, :meth:`~hf_triforce.caches.retrieval.RetrievalCache.chunk_ranking`) and, for
    the last ``reranked`` fraction of the layers, the ``[1, H_kv, N]`` middle chunks nominated for the steps to rank
    (``N = factor * k``, best first, spread :data:`NOMINATION_LOOKAHEAD` chunks forward; every middle chunk when they
    are fewer); ``None`` for the layers the steps leave as selected.

    ``queries`` are per-layer ``[1, H_q * m, D]``: the query heads of ``m`` positions (level 1 gives the tokens the
    last verification accepted, :meth:`~hf_triforce.hf.attention.QueryCapture.upto`; a chunk scores its best logit
    over them, as with one position). ``cache`` holds more than ``budget`` tokens (else there is nothing to choose).
    It reads every key once.

    Example:
        >>> indices, nominees = nominate(cache, queries, 384, 64, 1)  # doctest: +SKIP
        >>> nominees[0].shape  # [1, H_kv, 4 k]  # doctest: +SKIP
        torch.Size([1, 3, 156])
    """
    length, c = cache.get_seq_length(), cache.chunk_size
    k = chunk_layout(length, c, budget, recent_window)[2]
    first, layout = len(queries) - round(reranked * len(queries)), (length, c, budget, recent_window)
    extra = (factor - 1) * max(k, 1)  # ranks past the k-th
    scores = [
        cache.chunk_ranking(i, q, budget, recent_window, None, EVERY_CHUNK, length) for i, q in enumerate(queries)
    ]
    indices = _per_layer(lambda s: select_token_indices(s, *layout, lookahead), scores)
    chosen = _per_layer(lambda s: top_middle_chunks(s, *layout, NOMINATION_LOOKAHEAD, extra), scores[first:])
    return indices, [None] * first + chosen


def _per_layer(rank, scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """``rank`` (a function of ``[B, H_kv, C]`` scores) of each layer's ``scores``: in one call over them stacked
    where they share a shape and device (a few operations per layer cost more than their arithmetic), else one call
    per layer."""
    if len({(s.shape, s.device) for s in scores}) > 1:
        return [rank(s) for s in scores]
    return list(rank(torch.cat(scores)).split(scores[0].shape[0])) if scores else []


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

    On a GPU a step must not wait for it: with ``sync_free`` every shape is fixed (no ``nonzero``, no test of
    whether anything arrived), so :meth:`reselect_layer` queues its work and returns at once. It then rewrites all
    ``k`` middle slots of each KV head (a chunk that stays is copied onto itself) and returns the count of arrivals
    as a 0-dim tensor; the view ends with the same chunks as without it.

    Args:
        view: the :class:`~hf_triforce.caches.view.RetrievalView` (batch 1) to keep re-selecting.
        indices: the per-layer ``[1, H_kv, S]`` token indices it was gathered from.
        budget, recent_window, lookahead, rescore_candidates: the selection's settings
            (:meth:`~hf_triforce.caches.retrieval.RetrievalCache.select`).
        hold: how far past the ``k``-th rank a held chunk stays, as a fraction of ``k`` (0: the view follows the top
            ``k``; level 1 uses :data:`HOLD`).
        nominees: per-layer ``[1, H_kv, N]`` middle chunks (:func:`nominate`): only these are ranked (their keys
            copied once, here, then read at every step), the others score ``-inf``; a layer's ``None``: that layer is
            not re-ranked (:meth:`reselect_layer` copies nothing). ``None``: every layer ranks every chunk.
        sync_free: never wait for the device (above); level 1 sets it on CUDA, where waiting for each layer's
            queued work cost more than the re-ranking's own launches
            (``benchmarks/results/h100-sync-free-*``, docs/benchmarks.md).

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
        nominees: list[torch.Tensor | None] | None = None,
        sync_free: bool = False,
    ) -> None:
        self.view, self.source, self.length = view, view.source, view.source_length
        self.settings = (budget, recent_window, lookahead, rescore_candidates)
        c = self.source.chunk_size
        self.k = max(0, chunk_layout(self.length, c, budget, recent_window)[2])
        self.hold_ranks = int(hold * self.k)
        chunks = torch.stack([idx[0, :, c : c * (self.k + 1) : c] // c for idx in indices])  # [L, H_kv, k]
        layers, heads = chunks.shape[:2]
        self.held = torch.zeros(layers, heads, self.length // c + 1, dtype=torch.bool, device=chunks.device)
        self.held.scatter_(2, chunks, True)  # [L, H_kv, C]: whether a chunk is in the view
        self.slot_of = torch.zeros_like(self.held, dtype=torch.long)  # [L, H_kv, C]: the slot of a held chunk
        self.slot_of.scatter_(2, chunks, torch.arange(self.k, device=chunks.device).expand_as(chunks))
        self.nominees = None if nominees is None else [None if n is None else n[0] for n in nominees]  # [H_kv, N]
        self._nominee_keys = None if nominees is None else self._copy_nominees(nominees)
        self.sync_free = sync_free
        self._slot_heads = torch.arange(heads, device=chunks.device).repeat_interleave(self.k)  # [H_kv * k]

    @property
    def chunks(self) -> torch.Tensor:
        """``[L, H_kv, k]``: the chunk each middle slot holds (from :attr:`held` and :attr:`slot_of`)."""
        layers, heads = self.held.shape[:2]
        ids = self.held.nonzero()[:, 2].view(layers, heads, self.k)  # each (layer, head) holds k chunks
        return torch.empty_like(ids).scatter_(2, self.slot_of.gather(2, ids), ids)

    def reselect(self, queries: list[torch.Tensor]) -> int | torch.Tensor:
        """Rank the chunks for per-layer ``[1, H_q, D]`` ``queries`` and swap the view's; returns the chunks that
        arrived (a 0-dim tensor with ``sync_free``)."""
        return sum(self.reselect_layer(i, query) for i, query in enumerate(queries))

    def reselect_layer(self, layer: int, query: torch.Tensor) -> int | torch.Tensor:
        """Rank layer ``layer``'s chunks for ``query`` (``[1, H_q, D]``, or ``[1, H_q * m, D]`` for ``m`` queries
        per head, see :meth:`~hf_triforce.caches.retrieval.RetrievalCache.select_layer`) and swap that layer's
        chunks; returns the chunks that arrived (with ``sync_free`` a 0-dim tensor: read it once the step is
        done). Level 1's direct forward calls it inside each layer, with the layer's own query, just before
        attention."""
        if self.nominees is not None:
            return 0 if self.nominees[layer] is None else self._apply(layer, self._kept_nominees(layer, query))
        budget, window, lookahead, factor = self.settings
        scores = self.source.chunk_ranking(layer, query, budget, window, None, factor, self.length)
        return self._apply(layer, self._kept(layer, scores[0]))

    def _apply(self, layer: int, keep: torch.Tensor) -> int | torch.Tensor:
        """Make layer ``layer`` hold the chunks ``keep`` marks (``[H_kv, C]``): :meth:`_rewrite` or :meth:`_swap`."""
        return self._rewrite(layer, keep) if self.sync_free else self._swap(layer, keep)

    def _copy_nominees(self, nominees: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Per layer, the nominated chunks' keys ``[1, H_kv, N * chunk_size, D]``, contiguous (``None`` where
        ``nominees`` has ``None``)."""
        pairs, c = zip(self.source.layers, nominees, strict=True), self.source.chunk_size
        return [None if n is None else gather_chunks(layer.buffer.keys, n, c) for layer, n in pairs]

    def _kept_nominees(self, layer: int, query: torch.Tensor) -> torch.Tensor:
        """``[H_kv, C]``: the middle chunks layer ``layer`` keeps among its nominees, ranked by their largest logit for
        ``query`` (as :meth:`_kept`, without look-ahead: the nominees were spread forward when nominated)."""
        found = score_all_chunk_keys(query, self._nominee_keys[layer], self.source.chunk_size)[0]  # [H_kv, N]
        order = found.topk(min(found.shape[-1], self.k + self.hold_ranks), dim=-1).indices  # best first
        return self._held_or_best(layer, self.nominees[layer].gather(1, order))

    def _kept(self, layer: int, scores: torch.Tensor) -> torch.Tensor:
        """``[H_kv, C]``: the middle chunks layer ``layer`` keeps for chunk ``scores`` ``[H_kv, C]``: the top ``k``,
        or (``hold_ranks = r > 0``) its held chunks still in the top ``k + r`` and the best others."""
        budget, window, lookahead, _ = self.settings
        layout = (self.length, self.source.chunk_size, budget, window, lookahead, self.hold_ranks)
        return self._held_or_best(layer, top_middle_chunks(scores[None], *layout)[0])

    def _held_or_best(self, layer: int, order: torch.Tensor) -> torch.Tensor:
        """``[H_kv, C]``: of chunks ``order`` ``[H_kv, k + r]`` (best first), the top ``k``, or (``r > 0``) the held
        ones and the best others."""
        if self.hold_ranks:
            held = self.held[layer].gather(1, order)
            free = ~held
            kept = held | (free & (free.cumsum(1) <= self.k - held.sum(1, keepdim=True)))
        else:
            kept = (torch.arange(order.shape[-1], device=order.device) < self.k).expand_as(order)
        return torch.zeros_like(self.held[layer]).scatter_(1, order, kept)

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

    def _rewrite(self, layer: int, keep: torch.Tensor) -> torch.Tensor:
        """:meth:`_swap` in fixed shapes: each head's ``k`` kept chunks, arrivals first, go to the slots of the
        chunks leaving (as many as arrive) and the others to their own slots; returns the arrivals, 0-dim."""
        held, slot_of = self.held[layer], self.slot_of[layer]
        kept = _marked_first(keep, self.k)  # [H_kv, k]: each head keeps exactly k
        arriving = ~held.gather(1, kept)
        order = _marked_first(arriving, self.k)
        kept, arriving = kept.gather(1, order), arriving.gather(1, order)
        leaving = _marked_first(held & ~keep, self.k)  # its first entries pair with the arrivals
        slot = torch.where(arriving, slot_of.gather(1, leaving), slot_of.gather(1, kept))
        slot_of.scatter_(1, kept, slot)
        held.copy_(keep)
        self._copy(layer, self._slot_heads, slot.flatten(), kept.flatten())
        return arriving.sum()

    def _copy(self, layer: int, head: torch.Tensor, slot: torch.Tensor, chunk: torch.Tensor) -> None:
        """Copy chunks ``chunk`` of the source into middle slots ``slot`` of KV heads ``head`` (all ``[n]``)."""
        view, full = self.view.layers[layer].buffer, self.source.layers[layer].buffer
        view.copy_chunks(full, head, slot + 1, chunk, self.source.chunk_size)  # slot s sits after the sink chunk


def _marked_first(mask: torch.Tensor, n: int) -> torch.Tensor:
    """``[H, n]``: per row of ``mask`` (``[H, C]``, bool), the columns it marks, then the others, each in column
    order; a fixed shape, whatever the count.

    Example:
        >>> _marked_first(torch.tensor([[False, True, False, True]]), 3).tolist()
        [[1, 3, 0]]
    """
    return mask.to(torch.uint8).sort(dim=1, descending=True, stable=True).indices[:, :n]
