"""Chunk summaries, GQA-aware chunk scoring and sparse-view token selection (hf_triforce.caches.selection).

Every function is checked against a by-hand computation with Python loops, so a wrong reshape (e.g. an
interleaved instead of a consecutive GQA grouping) or an off-by-one in the recent window shows up.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import repeat_kv

from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.selection import (
    keys_scores,
    outside_window,
    ranks_every_chunk,
    rescore,
    select_token_indices,
    spread_forward,
    top_middle_chunks,
    window_layout,
)
from hf_triforce.kernels.retrieval import (
    chunk_means,
    gather_chunks,
    gather_tokens,
    score_all_chunk_keys,
    score_chunk_keys,
    score_chunks,
)

pytestmark = pytest.mark.unit


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _chunk_means_by_hand(keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    b, h, length, d = keys.shape
    n = length // chunk_size
    out = torch.zeros(b, h, n, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for c in range(n):
                total = torch.zeros(d, dtype=torch.float64)
                for t in range(c * chunk_size, (c + 1) * chunk_size):
                    total += keys[bi, hi, t].double()
                out[bi, hi, c] = total / chunk_size
    return out


def _scores_by_hand(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Query head ``j`` belongs to KV head ``j // group`` (``repeat_kv`` layout); sum that group's dot products."""
    b, hq, _ = query.shape
    hkv, n_chunks = summaries.shape[1], summaries.shape[2]
    group = hq // hkv
    out = torch.zeros(b, hkv, n_chunks, dtype=torch.float64)
    for bi in range(b):
        for g in range(hkv):
            for c in range(n_chunks):
                for j in range(g * group, (g + 1) * group):
                    out[bi, g, c] += float(torch.dot(query[bi, j].double(), summaries[bi, g, c].double()))
    return out


def _recent_start(length: int, chunk_size: int, recent_window: int) -> int:
    """``r`` as documented in ``select_token_indices``."""
    return (length - recent_window) // chunk_size * chunk_size


# --------------------------------------------------------------------------------------------------------------
# chunk_means / score_chunks
# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(0, 70),
    chunk_size=st.sampled_from([1, 3, 8, 16]),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_chunk_means_equals_mean_by_hand(length, chunk_size, heads, seed):
    keys = torch.randn(2, heads, length, 5, generator=_gen(seed))
    got = chunk_means(keys, chunk_size)
    assert got.shape == (2, heads, length // chunk_size, 5)
    torch.testing.assert_close(got.double(), _chunk_means_by_hand(keys, chunk_size), atol=1e-6, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    n_chunks=st.integers(0, 9),
    seed=st.integers(0, 2**16),
)
def test_score_chunks_sums_the_gqa_group_by_hand(kv_heads, group, n_chunks, seed):
    g = _gen(seed)
    query = torch.randn(2, kv_heads * group, 6, generator=g)
    summaries = torch.randn(2, kv_heads, n_chunks, 6, generator=g)
    got = score_chunks(query, summaries)
    assert got.shape == (2, kv_heads, n_chunks)
    torch.testing.assert_close(got.double(), _scores_by_hand(query, summaries), atol=1e-5, rtol=1e-5)


def test_score_chunks_grouping_matches_transformers_repeat_kv():
    """Query head j attends to ``repeat_kv(keys)[:, j]``: the score must sum exactly those query heads."""
    g = _gen(0)
    kv_heads, group = 3, 4
    query = torch.randn(1, kv_heads * group, 8, generator=g)
    summaries = torch.randn(1, kv_heads, 7, 8, generator=g)
    expanded = repeat_kv(summaries, group)  # [1, H_q, C, D]: query head j sees KV head j // group
    per_query_head = torch.einsum("bjd,bjcd->bjc", query, expanded)
    expected = per_query_head.reshape(1, kv_heads, group, 7).sum(dim=2)
    torch.testing.assert_close(score_chunks(query, summaries), expected, atol=1e-5, rtol=1e-5)
    # an interleaved grouping (j % kv_heads) would give a different answer on this data
    interleaved = per_query_head.reshape(1, group, kv_heads, 7).sum(dim=1)
    assert not torch.allclose(score_chunks(query, summaries), interleaved, atol=1e-3)


# --------------------------------------------------------------------------------------------------------------
# select_token_indices
# --------------------------------------------------------------------------------------------------------------


@st.composite
def _selection_case(draw):
    chunk_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    recent_chunks = draw(st.integers(0, 4))
    extra_chunks = draw(st.integers(0, 10))
    # valid configurations (TriForceConfig): budget >= sink chunk + recent window + one retrieved chunk
    budget = chunk_size * (2 + recent_chunks + extra_chunks)
    length = draw(st.integers(1, 40 * chunk_size + budget))
    heads = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    lookahead = draw(st.integers(0, 3))
    return chunk_size, chunk_size * recent_chunks, budget, length, heads, seed, lookahead


def _spread_by_hand(scores: list[float], candidates: list[int], lookahead: int) -> dict[int, float]:
    """Candidate chunk -> the best score among itself and the ``lookahead`` candidates before it."""
    return {c: max(scores[p] for p in candidates if c - lookahead <= p <= c) for c in candidates}


@settings(max_examples=80, deadline=None)
@given(case=_selection_case())
def test_select_token_indices_properties(case):
    chunk_size, recent_window, budget, length, heads, seed, lookahead = case
    batch = 2
    n_chunks = length // chunk_size
    scores = torch.randn(batch, heads, n_chunks, generator=_gen(seed))
    idx = select_token_indices(scores, length, chunk_size, budget, recent_window, lookahead)
    assert idx.dtype == torch.long and idx.shape[:2] == (batch, heads)

    if length <= budget:
        assert torch.equal(idx, torch.arange(length).expand(batch, heads, length))
        return

    r = _recent_start(length, chunk_size, recent_window)
    candidates = list(range(1, r // chunk_size))  # whole chunks strictly between the sink chunk and r
    k = min(len(candidates), (budget - chunk_size - (length - r)) // chunk_size)
    assert idx.shape[-1] == chunk_size + k * chunk_size + (length - r)
    assert idx.shape[-1] <= budget
    if k < len(candidates):  # the budget is used up: not even one more chunk would fit
        assert idx.shape[-1] + chunk_size > budget

    for b in range(batch):
        for h in range(heads):
            row = idx[b, h].tolist()
            assert row == sorted(set(row)), "indices must be sorted and unique"
            assert all(0 <= t < length for t in row)
            chosen = set(row)
            assert set(range(chunk_size)) <= chosen, "the sink chunk 0 is always kept"
            assert set(range(r, length)) <= chosen, "the recent tokens [r, length) are always kept"
            middle = chosen - set(range(chunk_size)) - set(range(r, length))
            middle_chunks = {t // chunk_size for t in middle}
            for c in middle_chunks:  # whole chunks only
                assert set(range(c * chunk_size, (c + 1) * chunk_size)) <= chosen
            spread = _spread_by_hand(scores[b, h].tolist(), candidates, lookahead)
            assert len(middle_chunks) == k
            if lookahead == 0:  # random scores: no ties, one right answer
                expected = set(sorted(candidates, key=lambda c: -spread[c])[:k])
                assert middle_chunks == expected, "the middle chunks are the top-k by this head's score"
            elif 0 < k < len(candidates):  # a chunk shares its score with the next ones: any top-k among ties
                left_out = max(spread[c] for c in candidates if c not in middle_chunks)
                assert min(spread[c] for c in middle_chunks) >= left_out


def test_lookahead_brings_the_chunks_after_the_best_one():
    """Chunk 4 scores best; with lookahead 2 chunks 5 and 6 come with it and outrank chunk 9's second best."""
    scores = torch.zeros(1, 1, 16)
    scores[0, 0, 4], scores[0, 0, 9] = 10.0, 5.0
    idx = select_token_indices(scores, 128, 8, 8 + 3 * 8 + 16, 16, lookahead=2)[0, 0].tolist()
    assert idx[8:-16] == list(range(32, 56))
    plain = select_token_indices(scores, 128, 8, 8 + 3 * 8 + 16, 16)[0, 0].tolist()
    assert {t // 8 for t in plain[8:-16]} >= {4, 9}


@pytest.mark.parametrize("length,budget,window,lookahead", [(128, 48, 16, 0), (203, 64, 16, 1), (90, 88, 8, 2)])
def test_top_middle_chunks_are_the_middle_of_the_selection(length, budget, window, lookahead):
    """What ``ChunkSwapper`` swaps towards: the set of chunks between the sink and the recent tokens of
    ``select_token_indices`` (same scores, same arguments), unordered."""
    scores = torch.randn(2, 3, length // 8, generator=_gen(length))
    top = top_middle_chunks(scores, length, 8, budget, window, lookahead)
    idx = select_token_indices(scores, length, 8, budget, window, lookahead)
    assert torch.equal(top.sort(dim=-1).values, idx[:, :, 8 : 8 * (top.shape[-1] + 1) : 8] // 8)


@pytest.mark.parametrize("lookahead", [0, 1, 3, 20])
def test_spread_forward_by_hand(lookahead):
    scores = torch.randn(2, 3, 9, generator=_gen(lookahead))
    out = spread_forward(scores, lookahead)
    for c in range(9):
        torch.testing.assert_close(out[..., c], scores[..., max(0, c - lookahead) : c + 1].amax(dim=-1))


def test_select_recent_start_rounds_down_to_a_chunk():
    """length 77, chunk 8, window 16: r = floor(61 / 8) * 8 = 56, so 21 recent tokens (a partial chunk + 16)."""
    scores = torch.arange(9.0).view(1, 1, 9)  # chunk 8 would score best but is in the recent region
    idx = select_token_indices(scores, 77, 8, 48, 16)[0, 0].tolist()
    assert idx[:8] == list(range(8))
    assert idx[-21:] == list(range(56, 77))
    # 48 - 8 - 21 = 19 -> 2 retrieved chunks: the best candidates among chunks 1..6 are 6 and 5
    assert idx[8:-21] == list(range(40, 56))
    assert len(idx) == 8 + 16 + 21


def test_select_heads_choose_independently():
    length, chunk, budget, window = 128, 8, 40, 16  # 16 chunks; r = 112; candidates 1..13; 2 per head
    scores = torch.zeros(1, 3, 16)
    scores[0, 0, [3, 9]] = 5.0
    scores[0, 1, [1, 13]] = 5.0
    scores[0, 2, [7, 8]] = 5.0
    scores[0, :, 14:] = 100.0  # recent chunks: must not be "retrieved"
    scores[0, :, 0] = 100.0  # the sink chunk: kept anyway, never counted twice
    idx = select_token_indices(scores, length, chunk, budget, window)
    assert idx.shape == (1, 3, budget)
    for h, chunks in enumerate([(3, 9), (1, 13), (7, 8)]):
        expected = list(range(8)) + [c * 8 + o for c in chunks for o in range(8)] + list(range(112, 128))
        assert idx[0, h].tolist() == expected


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 64), chunk_size=st.sampled_from([1, 4, 8]), seed=st.integers(0, 2**16))
def test_select_keeps_everything_when_it_fits(length, chunk_size, seed):
    budget = max(length, 3 * chunk_size) // chunk_size * chunk_size + chunk_size
    scores = torch.randn(1, 2, length // chunk_size, generator=_gen(seed))
    idx = select_token_indices(scores, length, chunk_size, budget, chunk_size)
    assert torch.equal(idx, torch.arange(length).expand(1, 2, length))


def test_gather_tokens_per_head():
    states = torch.randn(1, 2, 10, 3, generator=_gen(1))
    idx = torch.tensor([[[0, 4, 9], [1, 2, 3]]])
    got = gather_tokens(states, idx)
    for h in range(2):
        for s in range(3):
            assert torch.equal(got[0, h, s], states[0, h, int(idx[0, h, s])])


@pytest.mark.parametrize("layout", ["contiguous", "sliced", "strided"])
def test_gather_chunks_by_hand(layout):
    """Per batch row and head, chunk ``chunks[b, h, i]``'s tokens at ``i * chunk_size ..``; from a buffer's slice too
    (the cache's keys are the first ``length`` slots of a larger buffer, so rows of a head are not adjacent to the
    next head's), and from states whose tokens are not rows (a transposed view: the CPU's copy of whole chunks
    cannot read it, the general path does)."""
    buffer = torch.randn(2, 3, 64 if layout == "sliced" else 41, 5, generator=_gen(3))
    states = buffer[:, :, :41] if layout != "strided" else buffer.transpose(-1, -2).contiguous().transpose(-1, -2)
    chunks = torch.stack([torch.randperm(5, generator=_gen(i))[:4] for i in range(6)]).view(2, 3, 4)
    got = gather_chunks(states, chunks, 8)
    assert got.shape == (2, 3, 32, 5)
    for b in range(2):
        for h in range(3):
            for i, c in enumerate(chunks[b, h].tolist()):
                assert torch.equal(got[b, h, i * 8 : i * 8 + 8], states[b, h, c * 8 : c * 8 + 8])


@pytest.mark.parametrize("kv_heads, group", [(1, 1), (2, 3), (3, 4)])
def test_score_chunk_keys_is_the_largest_logit_by_hand(kv_heads, group):
    query = torch.randn(2, kv_heads * group, 8, generator=_gen(group))
    keys = torch.randn(2, kv_heads, 45, 8, generator=_gen(kv_heads))
    chunks = torch.stack([torch.randperm(5, generator=_gen(b))[:3] for b in range(2 * kv_heads)]).view(2, kv_heads, 3)
    got = score_chunk_keys(query, keys, chunks, 8)
    for b in range(2):
        for h in range(kv_heads):
            for f, c in enumerate(chunks[b, h].tolist()):
                logits = [float(query[b, q] @ keys[b, q // group, t]) for q in range(h * group, (h + 1) * group)
                          for t in range(c * 8, c * 8 + 8)]  # fmt: skip
                assert got[b, h, f].item() == pytest.approx(max(logits), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("kv_heads, group, queries", [(1, 1, 1), (2, 3, 1), (3, 4, 2)])
def test_score_all_chunk_keys_equals_score_chunk_keys_over_every_chunk(kv_heads, group, queries):
    """Read in place, every chunk: the same scores as the gather path nominating all of them; several queries per
    head (folded into the group, as level 1's multi-token forwards pass them) score a chunk by the largest of all."""
    query = torch.randn(2, kv_heads * group * queries, 8, generator=_gen(group))
    keys = torch.randn(2, kv_heads, 45, 8, generator=_gen(kv_heads))
    every = torch.arange(5).expand(2, kv_heads, 5)
    got = score_all_chunk_keys(query, keys, 8)
    torch.testing.assert_close(got, score_chunk_keys(query, keys, every, 8))
    by_query = query.view(2, kv_heads, group, queries, 8)
    singles = [score_all_chunk_keys(by_query[:, :, :, m].reshape(2, -1, 8), keys, 8) for m in range(queries)]
    torch.testing.assert_close(got, torch.stack(singles).amax(0))


@pytest.mark.parametrize("length", [203, 320])
def test_rescore_of_every_chunk_equals_nominating_them_all_by_gather(length):
    """``ranks_every_chunk``: the fast path (keys read in place, summaries unused) selects what the gather path
    selects when every candidate is nominated; forced infinite scores (a batch row's sink, padding) stay."""
    chunk, budget, window = 8, 48, 16
    query = torch.randn(1, 6, 8, generator=_gen(length))
    keys = torch.randn(1, 2, length, 8, generator=_gen(length + 1))
    scores = score_chunks(query, chunk_means(keys, chunk))
    scores[0, 1, 4] = float("inf")
    assert not ranks_every_chunk(length, chunk, budget, window, 1) and ranks_every_chunk(
        length, chunk, budget, window, 32
    )
    fast = rescore(scores, query, keys, length, chunk, budget, window, 32)
    candidates = (length - window) // chunk - 1
    nominated = torch.arange(1, 1 + candidates).expand(1, 2, candidates)
    by_gather = torch.full_like(scores, float("-inf")).scatter(
        -1, nominated, score_chunk_keys(query, keys, nominated, chunk)
    )
    by_gather = torch.where(scores.isinf(), scores, by_gather)
    torch.testing.assert_close(fast[..., 1 : 1 + candidates], by_gather[..., 1 : 1 + candidates])
    assert fast[0, 1, 4] == float("inf")
    assert torch.equal(select_token_indices(fast, length, chunk, budget, window, 1),
                       select_token_indices(by_gather, length, chunk, budget, window, 1))  # fmt: skip
    assert keys_scores(query, keys, length, chunk)[..., 0].eq(float("-inf")).all()  # the sink is kept anyway


def test_rescore_ranks_the_nominated_chunks_by_their_keys():
    """Chunk 2's mean key scores best but chunk 5 holds the key the query hits: with every candidate nominated
    (factor 8), the view takes chunk 5; nominating only the summaries' best (factor 1) keeps chunk 2."""
    length, chunk, budget, window = 96, 8, 8 + 8 + 16, 16  # sink + one chunk + recent
    keys = torch.zeros(1, 1, length, 4)
    keys[0, 0, 16:24, 0] = 1.0  # chunk 2: every key a little aligned
    keys[0, 0, 43, 0] = 5.0  # chunk 5: one key very aligned, the mean less than chunk 2's
    query = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    scores = score_chunks(query, chunk_means(keys, chunk))
    assert int(scores[0, 0, 1:10].argmax()) + 1 == 2
    for factor, expected in [(8, 5), (1, 2)]:
        rescored = rescore(scores, query, keys, length, chunk, budget, window, factor)
        idx = select_token_indices(rescored, length, chunk, budget, window)
        assert idx[0, 0, 8:16].tolist() == list(range(expected * 8, expected * 8 + 8)), factor
    forced = scores.clone()
    forced[0, 0, 3], forced[0, 0, 4] = float("inf"), float("-inf")
    rescored = rescore(forced, query, keys, length, chunk, budget, window, 8)
    assert rescored[0, 0, 3] == float("inf") and rescored[0, 0, 4] == float("-inf")


def test_retrieval_cache_select_rescores_when_asked():
    cache = RetrievalCache(num_layers=1, chunk_size=8, capacity=96)
    keys = torch.zeros(1, 1, 96, 4)
    keys[0, 0, 16:24, 0], keys[0, 0, 43, 0] = 1.0, 5.0
    cache.update(keys, torch.randn(1, 1, 96, 4), layer_idx=0)
    query = [torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])]
    plain = cache.select(query, 40, 16)[0][0, 0, 8:24].tolist()  # room for a chunk and its look-ahead chunk
    rescored = cache.select(query, 40, 16, rescore_candidates=8)[0][0, 0, 8:24].tolist()
    assert plain == list(range(16, 32)) and rescored == list(range(40, 56))


def _sliding_cache(layers: int, length: int, seed: int = 0) -> tuple[RetrievalCache, list[torch.Tensor]]:
    """A cache of ``length`` random tokens in ``layers`` layers (2 KV heads) and a random query per layer."""
    torch.manual_seed(seed)
    cache = RetrievalCache(num_layers=layers, chunk_size=8, capacity=length)
    for layer in range(layers):
        cache.update(torch.randn(1, 2, length, 16), torch.randn(1, 2, length, 16), layer_idx=layer)
    return cache, [torch.randn(1, 4, 16) for _ in range(layers)]


@pytest.mark.parametrize("length", [200, 203, 517])
@pytest.mark.parametrize("window", [40, 48, 57, 100])
@pytest.mark.parametrize("rescore_candidates", [0, 2, 1 << 30])
def test_a_sliding_layer_s_view_ends_with_its_whole_window_where_the_budget_has_room(
    length, window, rescore_candidates
):
    """Budget 128 holds the sink chunk and every window here: the sliding layer's view ends with the tokens its next
    query sees, ``[length - window + 1, length)``, contiguous (so the sliding mask over the compacted slots sees
    exactly them), and has as many tokens as the full layer's view (one layout for every layer). Without the window
    rule the view's last ``window`` slots hold retrieved chunks."""
    cache, queries = _sliding_cache(2, length)
    windows = [window, None]
    stacked = cache.select(queries, 128, 16, rescore_candidates=rescore_candidates, windows=windows)
    per_layer = [cache.select_layer(i, q, 128, 16, rescore_candidates=rescore_candidates, window=w)
                 for i, (q, w) in enumerate(zip(queries, windows, strict=True))]  # fmt: skip
    for got in (stacked, per_layer):
        sliding, full = got[0][0], got[1][0]
        assert sliding.shape == full.shape
        for head in sliding:
            assert head[-(window - 1) :].tolist() == list(range(length - window + 1, length))
    assert all(torch.equal(a, b) for a, b in zip(stacked, per_layer, strict=True))
    assert torch.equal(stacked[1], cache.select(queries, 128, 16, rescore_candidates=rescore_candidates)[1])


@pytest.mark.parametrize("rescore_candidates", [0, 2, 1 << 30])
def test_a_window_longer_than_the_budget_retrieves_only_inside_it(rescore_candidates):
    """Window 300 of a 600-token cache, budget 128: the sliding layer keeps the sink chunk and the recent tokens and
    retrieves only chunks wholly inside its window, even where chunks before it score best; the full layer
    retrieves those."""
    cache, queries = _sliding_cache(2, 600)
    for layer in range(2):  # chunks 5..9 (tokens 40..79, long before the window) match the query best
        keys = cache.layers[layer].buffer.keys
        keys[0, :, 40:80] = queries[layer][0, ::2, None] * 10
    indices = cache.select(queries, 128, 16, rescore_candidates=rescore_candidates, windows=[300, None])
    middle = lambda idx: idx[0, :, 8:-16]  # noqa: E731  between the sink chunk and the recent tokens
    assert bool((middle(indices[0]) >= 600 - 300 + 1).all())
    assert bool(((middle(indices[1]) >= 40) & (middle(indices[1]) < 80)).any())
    assert indices[0].shape == indices[1].shape


def test_window_layout_by_hand():
    assert window_layout(200, 8, 64, 16, None) == (16, 0)
    assert window_layout(200, 8, 64, 16, 48) == (48, 0)  # sink 8 + recent 48..55 <= 64
    assert window_layout(200, 8, 64, 16, 60) == (16, 141)  # no room: retrieve inside [141, 200)
    assert window_layout(200, 8, 64, 16, 8) == (16, 0)  # the recent tokens already hold the window
    assert window_layout(200, 8, 256, 16, 48) == (16, 0)  # everything fits: everything is kept
    assert window_layout(200, 8, 64, 16, 300) == (16, 0)  # the window holds the whole sequence
    assert outside_window(torch.zeros(1, 1, 4), 8, 0).tolist() == [[[0.0] * 4]]
