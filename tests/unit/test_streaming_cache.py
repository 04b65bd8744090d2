"""StreamingLLMCache (sinks + recent window at contiguous slots), rotate_keys, and the ModelDrafter on top of it.

References: transformers' own ``apply_rotary_pos_emb``/``LlamaRotaryEmbedding`` for positions, attention by hand in
float64, and ``generate(do_sample=False)`` of the same tiny model for the drafter's proposals.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv

from hf_triforce.caches.streaming import StreamingLLMCache, rotate_keys
from hf_triforce.hierarchy import ModelDrafter

pytestmark = pytest.mark.unit

KV_HEADS, Q_HEADS, HEAD_DIM = 2, 4, 16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rotary(head_dim: int = HEAD_DIM, theta: float = 10000.0) -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    return LlamaRotaryEmbedding(config)


def _rope(rotary: LlamaRotaryEmbedding, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Keys ``[B, H, S, D]`` rotated at ``positions`` ``[S]`` by transformers' own RoPE."""
    cos, sin = rotary(keys, positions[None])
    return apply_rotary_pos_emb(keys, keys, cos, sin)[1]


def _rope64(keys: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """float64 RoPE (rotate_half layout), independent of transformers, for the attention reference."""
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    k = keys.double()
    half = k.shape[-1] // 2
    return k * cos + torch.cat([-k[..., half:], k[..., :half]], dim=-1) * sin


def _kept_tokens(total: int, cached: int, sinks: int) -> list[int]:
    """Token ids a StreamingLLM cache of ``cached`` slots holds after seeing ``total`` tokens."""
    if cached == total:
        return list(range(total))
    return list(range(sinks)) + list(range(total - (cached - sinks), total))


class _Feeder:
    """Feeds pre-RoPE keys/values into a StreamingLLMCache as a model would: make_room, then RoPE at the slot."""

    def __init__(self, cache: StreamingLLMCache, rotary, keys: list[torch.Tensor], values: list[torch.Tensor]):
        self.cache, self.rotary, self.keys, self.values = cache, rotary, keys, values
        self.t = 0

    def step(self, q: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.cache.make_room(q)
        slot = self.cache.get_seq_length()
        positions = torch.arange(slot, slot + q)
        out = []
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            rotated = _rope(self.rotary, k[:, :, self.t : self.t + q], positions)
            out.append(self.cache.update(rotated, v[:, :, self.t : self.t + q], layer))
        self.t += q
        return out


def _raw_states(seed: int, total: int, layers: int = 2):
    g = _gen(seed)
    keys = [torch.randn(1, KV_HEADS, total, HEAD_DIM, generator=g) for _ in range(layers)]
    values = [torch.randn(1, KV_HEADS, total, HEAD_DIM, generator=g) for _ in range(layers)]
    return keys, values


def _make_cache(rotary, budget=24, sinks=4, evict_batch=3, layers=2) -> StreamingLLMCache:
    return StreamingLLMCache(
        num_layers=layers, budget=budget, sinks=sinks, inv_freq=rotary.inv_freq, evict_batch=evict_batch
    )


# --------------------------------------------------------------------------------------------------------------
# rotate_keys
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [-40, -7, -1, 0, 1, 13, 50])
def test_rotate_keys_equals_transformers_rope_at_shifted_positions(shift):
    rotary = _rotary()
    raw = torch.randn(1, KV_HEADS, 12, HEAD_DIM, generator=_gen(shift + 100))
    positions = torch.arange(12) * 5 + 45  # 45..100: p + shift stays >= 0
    at_p = _rope(rotary, raw, positions)
    expected = _rope(rotary, raw, positions + shift)
    torch.testing.assert_close(rotate_keys(at_p, rotary.inv_freq, shift), expected, atol=1e-5, rtol=1e-5)


def test_rotate_keys_partial_rotary_leaves_tail_channels_untouched():
    rotated_dims, head_dim = 8, 16  # inv_freq covers 8 of the 16 channels, as partial_rotary_factor=0.5 would
    rotary = _rotary(head_dim=rotated_dims)
    assert rotary.inv_freq.shape[0] == rotated_dims // 2
    raw = torch.randn(1, 2, 6, head_dim, generator=_gen(0))
    positions = torch.arange(6) + 10

    def partial(keys, pos):  # what partial-rotary models do: rotate the head of the channels, pass the rest
        return torch.cat([_rope(rotary, keys[..., :rotated_dims], pos), keys[..., rotated_dims:]], dim=-1)

    got = rotate_keys(partial(raw, positions), rotary.inv_freq, 9)
    torch.testing.assert_close(got, partial(raw, positions + 9), atol=1e-5, rtol=1e-5)
    assert torch.equal(got[..., rotated_dims:], raw[..., rotated_dims:])


# --------------------------------------------------------------------------------------------------------------
# StreamingLLMCache: contents after evictions, attention over them
# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    evict_batch=st.integers(0, 8),
    sinks=st.integers(0, 5),
    seed=st.integers(0, 999),
)
def test_streaming_cache_holds_sinks_and_window_at_slot_positions(steps, evict_batch, sinks, seed):
    rotary = _rotary()
    budget = 24
    total = sum(steps)
    raw_k, raw_v = _raw_states(seed, total)
    feeder = _Feeder(_make_cache(rotary, budget, sinks, evict_batch), rotary, raw_k, raw_v)
    for q in steps:
        out = feeder.step(q)
        n = feeder.cache.get_seq_length()
        assert n <= budget and out[0][0].shape[-2] == n
        kept = _kept_tokens(feeder.t, n, sinks)
        for layer, (keys, values) in enumerate(out):
            expected = _rope(rotary, raw_k[layer][:, :, kept], torch.arange(n))
            torch.testing.assert_close(keys, expected, atol=2e-5, rtol=1e-5)
            assert torch.equal(values, raw_v[layer][:, :, kept])


@pytest.mark.parametrize("evict_batch", [0, 5])
def test_attention_over_streaming_cache_equals_attention_by_hand(evict_batch):
    rotary = _rotary()
    sinks, total = 4, 97
    raw_k, raw_v = _raw_states(3, total)
    feeder = _Feeder(_make_cache(rotary, 24, sinks, evict_batch), rotary, raw_k, raw_v)
    g = _gen(4)
    sizes = []
    while feeder.t < total:
        sizes.append(min(int(torch.randint(1, 5, (1,), generator=g)), total - feeder.t))
        out = feeder.step(sizes[-1])
    n = feeder.cache.get_seq_length()
    kept = _kept_tokens(total, n, sinks)
    assert n < total and kept[:sinks] == [0, 1, 2, 3] and kept[-1] == total - 1
    for layer, (keys, values) in enumerate(out):
        raw_query = torch.randn(1, Q_HEADS, 1, HEAD_DIM, generator=g)
        query = _rope(rotary, raw_query, torch.tensor([n - 1]))  # the newest token sits in the last slot
        group = Q_HEADS // KV_HEADS
        got = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(keys, group), repeat_kv(values, group))
        ref_keys = _rope64(raw_k[layer][:, :, kept], torch.arange(n), rotary.inv_freq)
        ref_query = _rope64(raw_query, torch.tensor([n - 1]), rotary.inv_freq)
        for j in range(Q_HEADS):
            h = j // group
            weights = torch.softmax(ref_keys[0, h] @ ref_query[0, j, 0] / math.sqrt(HEAD_DIM), dim=0)
            ref = weights @ raw_v[layer][0, h, kept].double()
            torch.testing.assert_close(got[0, j, 0].double(), ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# rollback and capacity errors
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafted,rejected", [(5, 1), (5, 5), (3, 2)])
def test_crop_after_drafts_equals_never_seen(drafted, rejected):
    rotary = _rotary()
    history = [3, 4, 2, 5, 3, 4, 2, 3]  # 26 tokens: evictions happen during the history
    total = sum(history) + drafted + 10
    raw_k, raw_v = _raw_states(drafted * 10 + rejected, total)
    rolled = _Feeder(_make_cache(rotary, evict_batch=6), rotary, raw_k, raw_v)
    fresh = _Feeder(_make_cache(rotary, evict_batch=6), rotary, raw_k, raw_v)
    for q in history:
        rolled.step(q)
        fresh.step(q)
    assert rolled.t > rolled.cache.budget  # the history did evict
    assert rolled.cache.get_seq_length() + drafted <= rolled.cache.budget  # the drafted step itself does not

    rolled.step(drafted)
    rolled.cache.crop(-rejected)
    rolled.t -= rejected
    if drafted > rejected:
        fresh.step(drafted - rejected)
    for a, b in zip(rolled.cache.layers, fresh.cache.layers, strict=True):
        assert torch.equal(a.buffer.keys, b.buffer.keys) and torch.equal(a.buffer.values, b.buffer.values)
    for q in (4, 3, 3):  # and both keep evolving identically, evictions included
        for (ka, va), (kb, vb) in zip(rolled.step(q), fresh.step(q), strict=True):
            assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_make_room_evicts_in_batches():
    rotary = _rotary()
    cache = _make_cache(rotary, budget=20, sinks=4, evict_batch=3)
    raw_k, raw_v = _raw_states(0, 40)
    feeder = _Feeder(cache, rotary, raw_k, raw_v)
    feeder.step(18)
    assert cache.make_room(2) == 0
    assert cache.make_room(4) == 2 + 3  # overflow 2, plus the batch
    assert cache.get_seq_length() == 13


def test_make_room_raises_when_a_forward_cannot_fit():
    rotary = _rotary()
    cache = _make_cache(rotary, budget=10, sinks=4, evict_batch=2)
    with pytest.raises(ValueError, match="does not fit.*budget 10.*4 sinks"):
        cache.make_room(11)
    feeder = _Feeder(cache, rotary, *_raw_states(0, 20))
    feeder.step(8)
    with pytest.raises(ValueError, match="does not fit"):
        cache.make_room(7)  # only 4 window tokens can be evicted; 5 would be needed
    assert cache.get_seq_length() == 8  # a refused make_room leaves the cache alone
    assert cache.make_room(6) == 4
    with pytest.raises(ValueError, match="must exceed sinks"):
        StreamingLLMCache(num_layers=1, budget=4, sinks=4, inv_freq=rotary.inv_freq)


# --------------------------------------------------------------------------------------------------------------
# ModelDrafter over a tiny Llama
# --------------------------------------------------------------------------------------------------------------


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,  # livelier random logits: greedy continuations that do not just repeat one token
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def _greedy(model, ids: torch.Tensor, k: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids[None], do_sample=False, max_new_tokens=k, attention_mask=torch.ones_like(ids)[None])
    return out[0, ids.shape[0] :].tolist()


def _drafter(model, budget=64, sinks=4, evict_batch=8) -> ModelDrafter:
    cache = StreamingLLMCache(
        num_layers=model.config.num_hidden_layers,
        budget=budget,
        sinks=sinks,
        inv_freq=model.model.rotary_emb.inv_freq,
        evict_batch=evict_batch,
    )
    return ModelDrafter(model, cache, LogitsProcessorList(), do_sample=False)


def test_model_drafter_greedy_equals_generate_and_survives_rollback():
    model = _tiny_llama()
    drafter = _drafter(model)
    prefix = torch.randint(0, 128, (10,), generator=_gen(0))
    k = 6
    with torch.no_grad():
        drafts, probs = drafter.propose(prefix, k)
    assert probs is None and drafts.shape == (k,)
    assert drafts.tolist() == _greedy(model, prefix, k)
    assert len(set(drafts.tolist())) > 1  # a meaningful continuation, not a single repeated token

    # level 1 accepted two drafts and corrected the third: the drafter must roll back and continue exactly
    diverged = torch.cat([prefix, drafts[:2], (drafts[2:3] + 1) % 128, torch.tensor([5, 7])])
    with torch.no_grad():
        drafts2, _ = drafter.propose(diverged, k)
    assert drafts2.tolist() == _greedy(model, diverged, k)

    # everything accepted plus a bonus token: the drafter extends what it consumed
    extended = torch.cat([diverged, drafts2, torch.tensor([11])])
    with torch.no_grad():
        drafts3, _ = drafter.propose(extended, k)
    assert drafts3.tolist() == _greedy(model, extended, k)

    # the new sequence lies entirely inside what the drafter consumed (level 2 rejected, and its correction
    # happens to equal an old draft), or is the very same prefix again: it must still draft exactly
    inside = torch.cat([extended, drafts3[:2]])
    for again in (inside, inside):
        with torch.no_grad():
            drafts4, _ = drafter.propose(again, k)
        assert drafts4.tolist() == _greedy(model, again, k)
    assert drafter.cache.get_seq_length() < drafter.cache.budget  # nothing was ever evicted


def test_model_drafter_on_long_prefix_drafts_from_sinks_and_window():
    """A prefix longer than the budget: the drafter keeps the sinks and the most recent window, at slots 0..n-1."""
    model = _tiny_llama(seed=1)
    budget, sinks, evict_batch, k = 64, 4, 8, 6
    drafter = _drafter(model, budget, sinks, evict_batch)
    prefix = torch.randint(0, 128, (150,), generator=_gen(1))
    with torch.no_grad():
        drafts, _ = drafter.propose(prefix, k)
    window = budget - sinks - evict_batch
    kept = torch.cat([prefix[:sinks], prefix[-window:]])
    assert drafts.tolist() == _greedy(model, kept, k)
