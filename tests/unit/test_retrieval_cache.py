"""RetrievalCache (the target's full cache) and RetrievalView (its sparse, compacted level-1 view).

References are independent of the code under test: transformers' DynamicCache for the full cache,
``chunk_means`` recomputed from scratch for the summaries, and attention by hand in float64 (Python loops
over heads, gathering the selected token indices from the full K/V) for the sparse view.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.view import RetrievalView
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.kernels.retrieval import chunk_means

pytestmark = pytest.mark.unit

KV_HEADS, Q_HEADS, HEAD_DIM = 2, 8, 16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _kv(g: torch.Generator, n: int, heads: int = KV_HEADS, dim: int = HEAD_DIM) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, heads, n, dim, generator=g), torch.randn(1, heads, n, dim, generator=g)


def _filled_cache(seed: int, length: int, num_layers: int = 2, chunk_size: int = 8, capacity: int = 0):
    """A RetrievalCache with ``length`` random tokens per layer, plus the per-layer (K, V) it holds."""
    g = _gen(seed)
    cache = RetrievalCache(num_layers=num_layers, chunk_size=chunk_size, capacity=capacity)
    full = []
    for layer in range(num_layers):
        k, v = _kv(g, length)
        cache.update(k, v, layer)
        full.append((k, v))
    return cache, full


def _assert_same_state(a: RetrievalCache, b: RetrievalCache) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.buffer.keys, lb.buffer.keys)
        assert torch.equal(la.buffer.values, lb.buffer.values)
        assert torch.equal(la.summaries(), lb.summaries())


def _attention_by_hand(query, full_keys, full_values, indices, new_keys, new_values) -> torch.Tensor:
    """float64 causal attention of ``query`` ``[1, H_q, q, D]`` over per-KV-head gathered tokens + the new ones.

    Query head ``j`` uses KV head ``j // group``; query ``i`` sees every gathered token and new tokens ``0..i``.
    """
    _, hq, q, d = query.shape
    hkv = full_keys.shape[1]
    group = hq // hkv
    out = torch.zeros(1, hq, q, d, dtype=torch.float64)
    for j in range(hq):
        h = j // group
        rows = [int(t) for t in indices[0, h]]
        keys = torch.stack([full_keys[0, h, t] for t in rows] + [new_keys[0, h, t] for t in range(q)]).double()
        values = torch.stack([full_values[0, h, t] for t in rows] + [new_values[0, h, t] for t in range(q)]).double()
        for i in range(q):
            visible = len(rows) + i + 1
            weights = torch.softmax(keys[:visible] @ query[0, j, i].double() / math.sqrt(d), dim=0)
            out[0, j, i] = weights @ values[:visible]
    return out


def _sdpa_from_mask_sizes(view: RetrievalView, layer: int, query, keys, values, q_offset, kv_length) -> torch.Tensor:
    """What the attention layer computes: sdpa over the returned K/V with the mask transformers would build."""
    assert keys.shape[-2] == kv_length
    mask = torch.arange(kv_length)[None, :] <= (q_offset + torch.arange(query.shape[-2]))[:, None]
    group = query.shape[1] // keys.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(keys, group), repeat_kv(values, group), attn_mask=mask
    )


def _tiny_llama(seed: int = 0, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    config._attn_implementation = attn
    return LlamaForCausalLM(config).eval()


# --------------------------------------------------------------------------------------------------------------
# the full cache: DynamicCache semantics, summaries, rollback
# --------------------------------------------------------------------------------------------------------------

_OPS = st.lists(
    st.tuples(st.sampled_from(["append", "crop", "summaries"]), st.integers(1, 20)), min_size=1, max_size=12
)


@settings(max_examples=40, deadline=None)
@given(ops=_OPS, capacity=st.sampled_from([0, 5, 64]), chunk_size=st.sampled_from([1, 4, 8]), seed=st.integers(0, 999))
def test_behaves_like_dynamic_cache(ops, capacity, chunk_size, seed):
    g = _gen(seed)
    layers = 3
    ours = RetrievalCache(num_layers=layers, chunk_size=chunk_size, capacity=capacity)
    ref = DynamicCache()
    for op, n in ops:
        if op == "append":
            for layer in range(layers):
                k, v = _kv(g, n)
                got_k, got_v = ours.update(k, v, layer)
                ref_k, ref_v = ref.update(k, v, layer)
                assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v)
        elif op == "crop":
            n = min(n, ref.get_seq_length())
            if n == 0:
                continue
            ours.crop(-n)
            ref.crop(-n)
        elif ours.layers[0].is_initialized:
            for layer in ours.layers:  # lazily computed summaries, possibly stale after a crop
                layer.summaries()
        assert ours.get_seq_length() == ref.get_seq_length()
        for layer in range(layers):
            if ref.get_seq_length() == 0:
                continue
            assert torch.equal(ours.layers[layer].keys, ref.layers[layer].keys)
            assert torch.equal(ours.layers[layer].values, ref.layers[layer].values)
            expected = chunk_means(ref.layers[layer].keys, chunk_size)
            torch.testing.assert_close(ours.layers[layer].summaries(), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("len_a,len_b", [(20, 5), (24, 8), (21, 11), (3, 30)])
def test_crop_after_rejection_equals_never_seen(len_a, len_b):
    g = _gen(len_a * 100 + len_b)
    a = [_kv(g, len_a) for _ in range(2)]
    b = [_kv(g, len_b) for _ in range(2)]
    rolled = RetrievalCache(num_layers=2, chunk_size=8, capacity=16)
    fresh = RetrievalCache(num_layers=2, chunk_size=8, capacity=16)
    for layer in range(2):
        rolled.update(*a[layer], layer)
        rolled.update(*b[layer], layer)
        fresh.update(*a[layer], layer)
    for layer in rolled.layers:
        layer.summaries()  # summarize the rejected tokens' chunks before rolling back
    rolled.crop(-len_b)
    _assert_same_state(rolled, fresh)


def test_every_layers_summaries_share_one_tensor_and_stack_without_a_copy():
    """The layers' chunk means live side by side in one tensor: ``stacked`` is a view of it, equal to the layers'
    own, and it grows (doubling) keeping what was computed."""
    g = _gen(11)
    cache = RetrievalCache(num_layers=3, chunk_size=8, capacity=0)
    keys = [_kv(g, 40)[0] for _ in range(3)]
    for layer in range(3):
        cache.update(keys[layer], keys[layer], layer)
    own = [layer.summaries() for layer in cache.layers]
    stacked = cache.summaries.stacked(5)
    assert stacked.data_ptr() == cache.summaries.shared.data_ptr()  # a view, not a copy
    assert torch.equal(stacked, torch.cat(own)) and torch.equal(own[2], chunk_means(keys[2], 8))
    more = [_kv(g, 100)[0] for _ in range(3)]
    for layer in range(3):
        cache.update(more[layer], more[layer], layer)  # 140 tokens: 17 chunks, past the first room
        expected = chunk_means(torch.cat([keys[layer], more[layer]], dim=2), 8)
        torch.testing.assert_close(cache.layers[layer].summaries(), expected, atol=1e-6, rtol=1e-6)
    assert cache.summaries.shared.shape[3] >= 17


def test_summaries_of_a_layer_summarized_before_the_others_existed_are_computed_again_when_shared():
    """A layer summarized while the others held nothing keeps its own tensor until every layer exists; its chunk
    means are then computed again into the shared one, not read from memory never written."""
    g = _gen(12)
    cache = RetrievalCache(num_layers=2, chunk_size=8, capacity=0)
    k0, k1 = _kv(g, 24)[0], _kv(g, 24)[0]
    cache.update(k0, k0, 0)
    first = cache.layers[0].summaries().clone()
    assert cache.summaries.shared is None
    cache.update(k1, k1, 1)
    assert torch.equal(cache.layers[1].summaries(), chunk_means(k1, 8)) and cache.summaries.shared is not None
    assert torch.equal(cache.layers[0].summaries(), first)


def test_keep_rows_keeps_the_rows_summaries_in_every_layer():
    g = _gen(13)
    cache = RetrievalCache(num_layers=2, chunk_size=8, capacity=0)
    keys = [torch.randn(3, KV_HEADS, 32, HEAD_DIM, generator=g) for _ in range(2)]
    for layer in range(2):
        cache.update(keys[layer], keys[layer], layer)
        cache.layers[layer].summaries()
    cache.keep_rows(torch.tensor([2, 0]))
    for layer in range(2):
        assert torch.equal(cache.layers[layer].summaries(), chunk_means(keys[layer][[2, 0]], 8))


def test_crop_across_chunk_boundary_then_append_recomputes_summaries():
    g = _gen(7)
    cache = RetrievalCache(num_layers=2, chunk_size=8, capacity=0)
    k, v = _kv(g, 35)
    for layer in range(2):
        cache.update(k, v, layer)
    assert cache.layers[0].summaries().shape[2] == 4
    cache.crop(-12)  # 35 -> 23: chunk 2 (tokens 16..23) loses its last token, chunk 3 disappears
    k2, v2 = _kv(g, 14)
    for layer in range(2):
        cache.update(k2, v2, layer)  # 23 + 14 = 37 tokens: chunks 2, 3 recomputed from the new tokens
    expected_keys = torch.cat([k[:, :, :23], k2], dim=2)
    fresh = RetrievalCache(num_layers=2, chunk_size=8, capacity=0)
    for layer in range(2):
        fresh.update(expected_keys, torch.cat([v[:, :, :23], v2], dim=2), layer)
    for layer in range(2):
        got = cache.layers[layer].summaries()
        torch.testing.assert_close(got, chunk_means(expected_keys, 8), atol=1e-6, rtol=1e-6)
    _assert_same_state(cache, fresh)


# --------------------------------------------------------------------------------------------------------------
# sparse view: attention over the gathered tokens, lengths
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length,new", [(200, 1), (203, 3), (64, 4)])
def test_sparse_view_attention_equals_attention_by_hand(length, new):
    budget, window = 64, 16
    cache, full = _filled_cache(seed=length, length=length)
    g = _gen(length + 1)
    queries = [torch.randn(1, Q_HEADS, HEAD_DIM, generator=g) for _ in range(2)]
    indices = cache.select(queries, budget, window)
    view = cache.sparse_view(indices, extra_capacity=8)
    assert all(idx.shape[:2] == (1, KV_HEADS) for idx in indices)  # one row of indices per KV head
    visible = indices[0].shape[-1]
    assert visible == length if length <= budget else visible <= budget
    assert view.get_seq_length() == length  # true length: drives default position ids
    assert view.get_query_offset() == visible  # compacted length: drives the mask
    if length > budget:
        # different KV heads really do select different tokens for this random data
        assert any(not torch.equal(idx[0, 0], idx[0, 1]) for idx in indices)

    new_states = [_kv(g, new) for _ in range(2)]
    query = [torch.randn(1, Q_HEADS, new, HEAD_DIM, generator=g) for _ in range(2)]
    # transformers builds the mask once per forward, before any layer updates the cache
    q_offset = view.get_query_offset(0)
    sizes = [view.get_mask_sizes(new, layer) for layer in range(2)]
    assert all(kv_offset == 0 for _, kv_offset in sizes)
    for layer in range(2):
        keys, values = view.update(*new_states[layer], layer)
        got = _sdpa_from_mask_sizes(view, layer, query[layer], keys, values, q_offset, sizes[layer][0])
        ref = _attention_by_hand(query[layer], *full[layer], indices[layer], *new_states[layer])
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    assert view.get_seq_length() == length + new
    assert view.get_query_offset() == visible + new
    assert cache.get_seq_length() == length  # the view never writes to the full cache


@pytest.mark.parametrize("rescore", [0, 3, 1 << 30])  # 1 << 30: every chunk nominated, ranked by its keys in place
@pytest.mark.parametrize("rows,per_head", [(1, 1), (1, 3), (2, 2)])
def test_select_of_every_layer_at_once_equals_layer_by_layer(rows, per_head, rescore):
    """``select`` scores and ranks the layers stacked (one scoring, one top-k, with ``rescore_candidates`` one top-k
    of the nominees): the same indices as ``select_layer`` layer by layer, for batch rows and several queries per
    head."""
    g = _gen(rows * 10 + per_head)
    layers, length, budget, window = 4, 211, 64, 16
    cache = RetrievalCache(num_layers=layers, chunk_size=8)
    for layer in range(layers):
        cache.update(
            torch.randn(rows, KV_HEADS, length, HEAD_DIM, generator=g),
            torch.randn(rows, KV_HEADS, length, HEAD_DIM, generator=g),
            layer,
        )
    queries = [torch.randn(rows, Q_HEADS * per_head, HEAD_DIM, generator=g) for _ in range(layers)]
    stacked = cache.select(queries, budget, window, rescore_candidates=rescore)
    by_layer = [cache.select_layer(i, q, budget, window, rescore_candidates=rescore)
                for i, q in enumerate(queries)]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(stacked, by_layer, strict=True))
    assert len({tuple(idx[0, 0].tolist()) for idx in stacked}) >= layers - 1  # the layers really chose differently
    if rescore:  # the keys really re-ranked what the chunk means chose
        by_means = cache.select(queries, budget, window)
        assert any(not torch.equal(a, b) for a, b in zip(stacked, by_means, strict=True))


def test_select_over_layers_on_several_devices_goes_layer_by_layer():
    """A ``device_map`` over several devices puts layers' caches on different devices: they are not stacked (the
    ``meta`` device stands in for a second GPU: it has shapes, no data)."""
    cache = RetrievalCache(num_layers=2, chunk_size=8)
    for layer, device in enumerate(("cpu", "meta")):
        cache.update(*(torch.randn(1, KV_HEADS, 100, HEAD_DIM, device=device) for _ in range(2)), layer)
    queries = [torch.randn(1, Q_HEADS, HEAD_DIM, device=device) for device in ("cpu", "meta")]
    indices = cache.select(queries, 32, 8)
    assert [idx.device.type for idx in indices] == ["cpu", "meta"] and indices[1].shape == indices[0].shape
    assert cache.summaries.shared is None  # each layer's chunk means on its own device


def test_view_forward_equals_full_cache_forward_when_everything_fits():
    model = _tiny_llama()
    prompt = torch.randint(0, 128, (1, 200), generator=_gen(0))
    new = torch.randint(0, 128, (1, 3), generator=_gen(1))
    cache = RetrievalCache(num_layers=2, chunk_size=8)
    ref_cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt, position_ids=torch.arange(200)[None], **cache_kwargs(cache), use_cache=True)
        model(input_ids=prompt, **cache_kwargs(ref_cache), use_cache=True)
        queries = [torch.randn(1, 4, 16, generator=_gen(2)) for _ in range(2)]
        view = cache.sparse_view(cache.select(queries, budget=256, recent_window=16), extra_capacity=8)
        got = model(
            input_ids=new, position_ids=torch.arange(200, 203)[None], attention_mask=None, **cache_kwargs(view)
        ).logits
        ref = model(input_ids=new, **cache_kwargs(ref_cache), use_cache=True).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_view_forward_attention_equals_attention_by_hand_in_every_layer():
    """Small budget: each layer's attention output equals by-hand attention over its gathered tokens."""
    model = _tiny_llama(seed=1)
    n_heads, n_kv, d = 4, 2, 16
    prompt = torch.randint(0, 128, (1, 200), generator=_gen(3))
    new = torch.randint(0, 128, (1, 3), generator=_gen(4))
    cache = RetrievalCache(num_layers=2, chunk_size=8)
    with torch.no_grad():
        model(input_ids=prompt, position_ids=torch.arange(200)[None], **cache_kwargs(cache), use_cache=True)
    queries = [torch.randn(1, n_heads, d, generator=_gen(5)) for _ in range(2)]
    indices = cache.select(queries, budget=64, recent_window=16)
    view = cache.sparse_view(indices, extra_capacity=8)
    assert view.get_query_offset() == 64
    assert any(not torch.equal(idx[0, 0], idx[0, 1]) for idx in indices)

    captured = {}

    def hook(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"], output[0])

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=new, position_ids=torch.arange(200, 203)[None], attention_mask=None, **cache_kwargs(view))
    finally:
        for handle in handles:
            handle.remove()

    for layer_idx, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        hidden, (cos, sin), output = captured[layer_idx]
        with torch.no_grad():
            q = attn.q_proj(hidden).view(1, 3, n_heads, d).transpose(1, 2)
            k = attn.k_proj(hidden).view(1, 3, n_kv, d).transpose(1, 2)
            v = attn.v_proj(hidden).view(1, 3, n_kv, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            full = cache.layers[layer_idx]
            ref = _attention_by_hand(q, full.buffer.keys, full.buffer.values, indices[layer_idx], k, v)
            ref = attn.o_proj(ref.float().transpose(1, 2).reshape(1, 3, n_heads * d))
        torch.testing.assert_close(output, ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# sync and memory
# --------------------------------------------------------------------------------------------------------------


def _append_all(cache, states) -> None:
    for layer, (k, v) in enumerate(states):
        cache.update(k, v, layer)


def test_sync_copies_new_full_cache_tokens_and_drops_drafts():
    length = 150
    cache, full = _filled_cache(seed=11, length=length)
    g = _gen(12)
    queries = [torch.randn(1, Q_HEADS, HEAD_DIM, generator=g) for _ in range(2)]
    indices = cache.select(queries, budget=48, recent_window=16)
    view = cache.sparse_view(indices, extra_capacity=20)
    static = indices[0].shape[-1]
    gathered = [view.layers[layer].buffer.keys.clone() for layer in range(2)]

    accepted = []  # what the full cache receives after each verification
    for step in range(3):
        drafts = [_kv(g, 4) for _ in range(2)]
        _append_all(view, drafts)  # level-1 drafting writes only to the view
        assert view.get_seq_length() == cache.get_seq_length() + 4
        assert cache.get_seq_length() == length + sum(a[0][0].shape[-2] for a in accepted)
        step_states = [_kv(g, 2 + step) for _ in range(2)]
        _append_all(cache, step_states)
        accepted.append(step_states)
        view.sync()

        total_new = sum(a[0][0].shape[-2] for a in accepted)
        assert view.tail_length() == total_new
        assert view.get_seq_length() == cache.get_seq_length() == length + total_new
        assert view.get_query_offset() == static + total_new
        for layer in range(2):
            new_k = torch.cat([a[layer][0] for a in accepted], dim=2)
            new_v = torch.cat([a[layer][1] for a in accepted], dim=2)
            assert torch.equal(view.layers[layer].buffer.keys, torch.cat([gathered[layer], new_k], dim=2))
            assert torch.equal(view.layers[layer].buffer.values[:, :, static:], new_v)
            # the full cache is exactly prompt + accepted tokens: no drafted token ever got in
            assert torch.equal(cache.layers[layer].buffer.keys, torch.cat([full[layer][0], new_k], dim=2))
            assert torch.equal(cache.layers[layer].buffer.values, torch.cat([full[layer][1], new_v], dim=2))


@pytest.mark.parametrize("length", [300, 3000, 40])
def test_view_memory_is_budget_plus_extra_capacity(length):
    budget, extra, layers = 64, 24, 2
    cache, _ = _filled_cache(seed=0, length=length, num_layers=layers)
    queries = [torch.randn(1, Q_HEADS, HEAD_DIM, generator=_gen(1)) for _ in range(layers)]
    indices = cache.select(queries, budget, 16)
    view = cache.sparse_view(indices, extra_capacity=extra)
    selected = indices[0].shape[-1]
    assert selected <= budget
    per_slot = 2 * 1 * KV_HEADS * HEAD_DIM * torch.float32.itemsize  # keys + values, one token
    slots = -(-(selected + extra) // 8) * 8  # whole chunks of 8 (the swapper copies chunk rows)
    expected = layers * slots * per_slot
    assert view.kv_nbytes() == expected <= layers * (budget + extra + 7) * per_slot  # any full length
    assert cache.kv_nbytes() >= layers * length * per_slot
    g = _gen(2)
    for _ in range(extra):  # filling the extra capacity must not reallocate
        _append_all(view, [_kv(g, 1) for _ in range(layers)])
    assert view.kv_nbytes() == expected


SWAP_BUDGET, WINDOW = 64, 16


def _queries(seed: int, layers: int = 2) -> list[torch.Tensor]:
    g = _gen(seed)
    return [torch.randn(1, Q_HEADS, HEAD_DIM, generator=g) for _ in range(layers)]


def test_a_cache_and_its_views_hold_whole_chunks_of_slots():
    cache, _ = _filled_cache(seed=1, length=301)
    view = cache.sparse_view(cache.select(_queries(1), SWAP_BUDGET, WINDOW), extra_capacity=13)
    assert all(layer.buffer._k.shape[2] % 8 == 0 for layer in [*cache.layers, *view.layers])
