"""Which tokens a retrieval view keeps: the sink chunk, the top-scoring chunks and the recent window."""

from __future__ import annotations

import torch

from ..kernels.retrieval import chunk_key_scores, score_all_chunk_keys

LOOKAHEAD = 1
"""Chunks after each top-scoring chunk that a view also keeps: text being copied is read forward, so a round's drafts
need the chunk after the one the query attends to now (more than one did no better)."""


def select_token_indices(
    scores: torch.Tensor, length: int, chunk_size: int, budget: int, recent_window: int, lookahead: int = 0
) -> torch.Tensor:
    """Token indices ``[B, H_kv, S]`` of the sparse view: sink chunk + top-scoring chunks + recent tokens, sorted, the
    same ``S <= max(budget, length)`` for every head.

    Chunk 0 and the tokens from ``floor((length - recent_window) / chunk_size) * chunk_size`` on are always kept; the
    best whole chunks in between (``scores`` ``[B, H_kv, C >= length // chunk_size]``) fill ``budget`` (a multiple of
    ``chunk_size``). With ``lookahead = k`` a chunk also takes the scores of the ``k`` before it
    (:func:`spread_forward`): copied text is read forward. ``length <= budget`` keeps every token.

    Example:
        >>> idx = select_token_indices(torch.arange(8.).view(1, 1, 8), 64, 8, 32, 8)
        >>> idx[0, 0, :8].tolist(), idx.shape[-1]
        ([0, 1, 2, 3, 4, 5, 6, 7], 32)
    """
    b, h = scores.shape[:2]
    device = scores.device
    if length <= budget:
        return torch.arange(length, device=device).expand(b, h, length)
    recent_start = chunk_layout(length, chunk_size, budget, recent_window)[0]
    chunk_ids = top_middle_chunks(scores, length, chunk_size, budget, recent_window, lookahead).sort(dim=-1).values
    offsets = torch.arange(chunk_size, device=device)
    middle = (chunk_ids[..., None] * chunk_size + offsets).flatten(2)
    sink = offsets.expand(b, h, chunk_size)
    recent = torch.arange(recent_start, length, device=device).expand(b, h, length - recent_start)
    return torch.cat([sink, middle, recent], dim=-1)


def top_middle_chunks(
    scores: torch.Tensor,
    length: int,
    chunk_size: int,
    budget: int,
    recent_window: int,
    lookahead: int = 0,
) -> torch.Tensor:
    """``[B, H_kv, k]`` ids of the chunks :func:`select_token_indices` takes between the sink and the recent tokens,
    best first (``length > budget``).

    Example:
        >>> top_middle_chunks(torch.tensor([[[0.0, 1.0, 5.0, 2.0, 4.0, 0.0, 0.0]]]), 56, 8, 32, 8)
        tensor([[[2, 4]]])
    """
    _, candidates, k = chunk_layout(length, chunk_size, budget, recent_window)
    middle = spread_forward(scores[:, :, 1 : 1 + candidates], lookahead)
    if k <= 0:
        return scores.new_zeros((*scores.shape[:2], 0), dtype=torch.long)
    return middle.topk(min(candidates, k), dim=-1).indices + 1


def chunk_layout(length: int, chunk_size: int, budget: int, recent_window: int) -> tuple[int, int, int]:
    """``(recent_start, candidates, k)`` of a selection: where the recent tokens start, how many chunks lie between the
    sink chunk and them, and how many of those the budget has room for (``<= 0``: none).

    Example:
        >>> chunk_layout(6144, 8, 768, 64)  # a 6K cache at budget 1/8: 759 middle chunks, room for 87
        (6080, 759, 87)
    """
    recent_start = max(chunk_size, (length - recent_window) // chunk_size * chunk_size)
    candidates = recent_start // chunk_size - 1
    return recent_start, candidates, min(candidates, (budget - chunk_size - (length - recent_start)) // chunk_size)


def window_layout(length: int, chunk_size: int, budget: int, recent_window: int, window: int | None) -> tuple[int, int]:
    """``(recent_window, window_start)`` of a selection for a layer attending through a sliding ``window``.

    If the budget holds the whole window after the sink chunk, the recent window grows to it (``window_start = 0``): the
    sliding mask over the compacted slots then sees what the target's layer sees. Otherwise only chunks wholly inside
    the window compete (:func:`outside_window`). Every layout gives the same number of tokens.

    Example:
        >>> [window_layout(6144, 8, 768, 64, window) for window in (512, 4096, None)]  # a 6K cache, budget 768
        [(512, 0), (64, 2049), (64, 0)]
    """
    if window is None or window > length or length <= budget or window <= recent_window:
        return recent_window, 0  # every token, or a window the recent tokens already hold
    if chunk_layout(length, chunk_size, budget, window)[2] >= 0:
        return window, 0
    return recent_window, length - window + 1


def outside_window(scores: torch.Tensor, chunk_size: int, window_start: int) -> torch.Tensor:
    """``scores`` ``[B, H_kv, C]`` with every chunk that starts before token ``window_start`` at ``-inf``.

    Example:
        >>> outside_window(torch.tensor([[[9.0, 5.0, 4.0, 1.0]]]), 8, 9).tolist()
        [[[-inf, -inf, 4.0, 1.0]]]
    """
    if window_start <= 0:
        return scores
    starts = torch.arange(scores.shape[-1], device=scores.device) * chunk_size
    return scores.float().masked_fill(starts < window_start, float("-inf"))


def rescore(
    scores: torch.Tensor,
    query: torch.Tensor,
    keys: torch.Tensor,
    length: int,
    chunk_size: int,
    budget: int,
    recent_window: int,
    factor: int,
) -> torch.Tensor:
    """``[B, H_kv, C]`` float32 chunk scores where the ``factor * k`` best candidates (``k``: chunks the view has room
    for) are re-scored by their keys.

    ``scores`` were made with ``query`` ``[B, H_q, D]``; ``keys``: ``[B, H_kv, >= length, D]``, or a layer's
    :class:`~hf_triforce.caches.buffers.KVBuffer` (an offloaded one copies only what is scored). Nominees score
    :func:`~hf_triforce.kernels.retrieval.chunk_key_scores`, other candidates ``-inf``; once all are nominated
    (:func:`ranks_every_chunk`) the keys are read in place (:func:`keys_scores`). Infinite scores stay as they are.

    Example:
        >>> keys = torch.zeros(1, 1, 40, 2); keys[0, 0, 20] = torch.tensor([3.0, 0.0])
        >>> scores = torch.tensor([[[0.0, 5.0, 4.0, 1.0, 0.0]]])  # chunk 1's mean key scores best
        >>> rescore(scores, torch.tensor([[[1.0, 0.0]]]), keys, 40, 8, 24, 8, 2).tolist()  # room for one chunk
        [[[-inf, 0.0, 3.0, -inf, -inf]]]
    """
    if length <= budget:
        return scores
    if ranks_every_chunk(length, chunk_size, budget, recent_window, factor):
        by_keys = keys_scores(query, keys if torch.is_tensor(keys) else keys.read_keys(0, length), length, chunk_size)
        out = torch.full_like(scores, float("-inf"), dtype=torch.float32)
        out[..., : by_keys.shape[-1]] = by_keys[..., : out.shape[-1]]
        return torch.where(scores.isinf(), scores.float(), out)
    nominated = nominate_chunks(scores, length, chunk_size, budget, recent_window, factor)
    read = (keys, nominated) if torch.is_tensor(keys) else keys.gather_chunk_keys(nominated, chunk_size)
    return with_key_scores(scores, nominated, chunk_key_scores(query, *read, chunk_size))


def nominate_chunks(
    scores: torch.Tensor, length: int, chunk_size: int, budget: int, recent_window: int, factor: int
) -> torch.Tensor:
    """``[B, H_kv, F]`` ids of the ``F = factor * k`` best candidate chunks :func:`rescore` re-scores (all if fewer).

    Example:
        >>> nominate_chunks(torch.tensor([[[0.0, 5.0, 4.0, 1.0, 0.0]]]), 40, 8, 24, 8, 2)  # room for one chunk
        tensor([[[1, 2]]])
    """
    _, candidates, k = chunk_layout(length, chunk_size, budget, recent_window)
    middle = scores[:, :, 1 : 1 + candidates].float()
    return middle.topk(min(candidates, factor * max(k, 1)), dim=-1).indices + 1


def with_key_scores(scores: torch.Tensor, nominated: torch.Tensor, by_keys: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, C]`` float32: ``by_keys`` ``[B, H_kv, F]`` at ``nominated``, else ``-inf`` (infinite scores kept).

    Example:
        >>> with_key_scores(torch.tensor([[[float("inf"), 5.0, 4.0]]]), torch.tensor([[[2]]]), torch.tensor([[[3.0]]]))
        tensor([[[inf, -inf, 3.]]])
    """
    out = torch.full_like(scores, float("-inf"), dtype=torch.float32).scatter(-1, nominated, by_keys)
    return torch.where(scores.isinf(), scores.float(), out)


def ranks_every_chunk(length: int, chunk_size: int, budget: int, recent_window: int, factor: int) -> bool:
    """Whether :func:`rescore` with ``factor`` nominates every candidate chunk (then the summaries play no part).

    Example:
        >>> ranks_every_chunk(6144, 8, 768, 64, 4), ranks_every_chunk(6144, 8, 768, 64, 32)
        (False, True)
    """
    _, candidates, k = chunk_layout(length, chunk_size, budget, recent_window)
    return factor > 0 and factor * max(k, 1) >= candidates


def keys_scores(query: torch.Tensor, keys: torch.Tensor, length: int, chunk_size: int) -> torch.Tensor:
    """``[B, H_kv, C]`` each complete chunk's largest logit for ``query`` ``[B, H_q, D]``, keys read in place; the sink
    chunk scores ``-inf`` (kept anyway).

    Example:
        >>> keys = torch.zeros(1, 1, 24, 2); keys[0, 0, 13] = torch.tensor([3.0, 0.0])
        >>> keys_scores(torch.tensor([[[1.0, 0.0]]]), keys, 24, 8).tolist()
        [[[-inf, 3.0, 0.0]]]
    """
    scores = score_all_chunk_keys(query, keys[:, :, : length // chunk_size * chunk_size], chunk_size)
    scores[..., 0] = float("-inf")
    return scores


def spread_forward(scores: torch.Tensor, lookahead: int) -> torch.Tensor:
    """``out[..., c] = max(scores[..., c - lookahead : c + 1])``: each chunk's score also lifts the chunks after it.

    Example:
        >>> spread_forward(torch.tensor([0.0, 5.0, 1.0, 0.0, 2.0]), 1).tolist()
        [0.0, 5.0, 5.0, 1.0, 2.0]
    """
    out = scores
    for shift in range(1, min(lookahead, scores.shape[-1] - 1) + 1):
        out = torch.cat([out[..., :shift], torch.maximum(out[..., shift:], scores[..., :-shift])], dim=-1)
    return out
