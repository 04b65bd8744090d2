"""A prefilled cache passed to a TriForce ``generate()`` is reused, as plain ``generate()`` reuses it.

The patterns transformers documents: prefill a shared prefix once (a forward, or plain ``generate()``) and
``copy.deepcopy`` the cache per question; pass the cache a call returned to the next chat turn. Checked here:
greedy output identical to plain ``generate()`` given the same cache (every family, every level-0 drafter),
the caller's cache object ending as plain ``generate()`` leaves it (same length, same keys and values up to
float32 rounding of multi-token forwards), the returned cache, only the uncached tokens prefilled, and the
caches TriForce cannot start from refused before any forward. Sampled: seed for seed, the tokens of the same call
without the prefilled cache (:func:`test_sampled_calls_from_a_prefilled_cache_draw_what_fresh_calls_draw`), whose
distribution ``test_sampling_distribution.py`` tests.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, QuantizedCache

import hf_triforce
from hf_triforce import RetrievalCache, TriForceConfig, UnsupportedGenerationError
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs, output_cache
from tests.support.sampled_runs import PROMPT_LENGTH, check_paths, one_thread, same_tokens

pytestmark = pytest.mark.integration

CFG = dict(
    retrieval_budget=64, recent_window=16, chunk_size=8, gamma1=2, gamma2=4, draft_cache_budget=48,
    adaptive=False,  # a fixed schedule: every round speculates, so each case's assert_ran holds on any machine
)  # fmt: skip
FAMILIES = ("llama_mha", "llama_gqa", "mistral", "qwen2", "qwen3")
SAME_SEEDS = range(100)
"""Seeds of the sampled same-tokens test (``torch.manual_seed(i)`` for call ``i``)."""
KV_ATOL = 1e-4  # float32 keys/values of a multi-token forward vs one-token steps (measured: ~2e-6)


def prefilled(model, ids: torch.LongTensor) -> DynamicCache:
    """A ``DynamicCache`` holding ``ids`` ``[1, n]``, prefilled by one plain forward."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **cache_kwargs(cache))
    return cache


def generate(model, ids, cache=None, triforce=True, drafter="ngram", assistant=None, **kwargs):
    kwargs = {"max_new_tokens": 24, "do_sample": False, "return_dict_in_generate": True, **kwargs}
    if cache is not None:
        kwargs[CACHE_ARG] = cache
    if triforce:
        kwargs["triforce_config"] = TriForceConfig(**CFG, drafter=drafter)
        if drafter == "model":
            kwargs["assistant_model"] = assistant
    return model.generate(ids, **kwargs)


def assert_same_cache(ours, plain) -> None:
    """Same length and keys/values per layer (up to float32 rounding)."""
    assert ours.get_seq_length() == plain.get_seq_length()
    for mine, theirs in zip(ours.layers, plain.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=KV_ATOL, rtol=0)
        torch.testing.assert_close(mine.values, theirs.values, atol=KV_ATOL, rtol=0)


@pytest.mark.parametrize("drafter", ["ngram", "model", "none"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_a_prefilled_cache_equals_plain_generate(zoo, make_prompt, assert_ran, family, drafter):
    model, draft = zoo.target(family), zoo.draft(family)
    prompt = make_prompt(300, seed=FAMILIES.index(family), repetitive=True)
    prefix = prefilled(model, prompt[:, :250])
    mine, theirs = copy.deepcopy(prefix), copy.deepcopy(prefix)
    out = generate(model, prompt, mine, drafter=drafter, assistant=draft)
    plain = generate(model, prompt, theirs, triforce=False)
    assert torch.equal(out.sequences, plain.sequences)
    assert output_cache(out) is mine and output_cache(plain) is theirs
    assert mine.get_seq_length() == out.sequences.shape[1] - 1
    assert_same_cache(mine, theirs)
    stats = hf_triforce.last_stats(model)
    assert stats.reused_tokens == 250 and stats.target_forwards < stats.new_tokens
    assert_ran(stats, drafted=("level1",) if drafter == "none" else ("level0", "level1"), rejected=("level1",))


def test_cache_from_plain_generate_is_reused(llama, make_prompt, assert_ran):
    """A cache left by plain generate() (prompt + answer) serves the next call; only the new tokens are fed."""
    first = make_prompt(200, seed=3)
    plain_first = generate(llama, first, DynamicCache(config=llama.config), triforce=False, max_new_tokens=8)
    follow_up = torch.cat([plain_first.sequences, make_prompt(12, seed=4)], dim=1)
    mine, theirs = copy.deepcopy(output_cache(plain_first)), copy.deepcopy(output_cache(plain_first))
    seen = []
    hook = llama.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        out = generate(llama, follow_up, mine)
    finally:
        hook.remove()
    assert seen[0] == follow_up.shape[1] - 207, "only the uncached tokens are prefilled"
    assert_ran(llama, rejected=("level1",))
    plain = generate(llama, follow_up, theirs, triforce=False)
    assert torch.equal(out.sequences, plain.sequences)
    assert_same_cache(mine, theirs)


def test_deprecated_past_key_values_name(llama, make_prompt, assert_ran):
    prompt = make_prompt(260, seed=5, repetitive=True)
    cache = prefilled(llama, prompt[:, :200])
    reference = generate(llama, prompt, copy.deepcopy(cache), triforce=False).sequences
    kwargs = dict(max_new_tokens=24, do_sample=False, triforce_config=TriForceConfig(**CFG))
    if CACHE_ARG == "cache":  # transformers >= 5.24 renamed it; the old name still works, with its FutureWarning
        with pytest.warns(FutureWarning, match="past_key_values"):
            out = llama.generate(prompt, past_key_values=cache, **kwargs)
    else:
        out = llama.generate(prompt, past_key_values=cache, **kwargs)
    assert torch.equal(out, reference)
    assert cache.get_seq_length() == out.shape[1] - 1
    assert_ran(llama)
    assert hf_triforce.last_stats(llama).reused_tokens == 200


def test_deep_copy_per_question_equals_fresh_prefills(llama, llama_draft, make_prompt, assert_ran):
    """One shared prefix, several questions: each answer equals a fresh call; the shared cache is untouched."""
    document = make_prompt(240, seed=6, repetitive=True)
    shared = prefilled(llama, document)
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in shared.layers]
    for seed in range(3):
        ids = torch.cat([document, make_prompt(10, seed=10 + seed)], dim=1)
        reused = generate(llama, ids, copy.deepcopy(shared), drafter="model", assistant=llama_draft).sequences
        assert_ran(llama, drafted=("level0", "level1"))
        assert hf_triforce.last_stats(llama).reused_tokens == 240
        fresh = generate(llama, ids, drafter="model", assistant=llama_draft).sequences
        assert torch.equal(reused, fresh)
    assert shared.get_seq_length() == 240
    for layer, (keys, values) in zip(shared.layers, snapshot, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


@pytest.mark.parametrize("passed", ["none", "empty"])
def test_returned_cache_serves_the_next_turn(llama, make_prompt, assert_ran, passed):
    """Turn 2 passes turn 1's returned cache (TriForce's own, used in place) plus a new message."""
    turn1 = make_prompt(220, seed=7, repetitive=True)
    cache = None if passed == "none" else DynamicCache(config=llama.config)
    out1 = generate(llama, turn1, cache)
    assert_ran(llama)
    returned = output_cache(out1)
    assert returned.get_seq_length() == out1.sequences.shape[1] - 1
    if passed == "none":
        assert isinstance(returned, RetrievalCache)
    else:
        assert returned is cache
    turn2 = torch.cat([out1.sequences, make_prompt(9, seed=8)], dim=1)
    plain_cache = generate(llama, turn1, DynamicCache(config=llama.config), triforce=False)
    out2 = generate(llama, turn2, returned)
    plain2 = generate(llama, turn2, output_cache(plain_cache), triforce=False)
    assert torch.equal(out1.sequences, plain_cache.sequences) and torch.equal(out2.sequences, plain2.sequences)
    assert output_cache(out2) is returned and returned.get_seq_length() == out2.sequences.shape[1] - 1
    assert hf_triforce.last_stats(llama).reused_tokens == out1.sequences.shape[1] - 1
    assert_ran(llama)
    plain_returned = output_cache(plain2)
    for mine, theirs in zip(returned.layers, plain_returned.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=KV_ATOL, rtol=0)


def test_returned_cache_also_serves_plain_generate(llama, make_prompt):
    """TriForce's returned cache is a transformers Cache: plain generate() continues from it identically."""
    turn1 = make_prompt(220, seed=9, repetitive=True)
    out1 = generate(llama, turn1)
    turn2 = torch.cat([out1.sequences, make_prompt(9, seed=10)], dim=1)
    from_ours = generate(llama, turn2, output_cache(out1), triforce=False).sequences
    assert torch.equal(from_ours, generate(llama, turn2, triforce=False).sequences)


# ---------------------------------------------------------------------------------------------------------------
# caches TriForce cannot start from: refused before any forward


@pytest.fixture
def watched(llama, llama_draft, forward_counter):
    counter = forward_counter(llama, llama_draft)
    yield
    counter.remove()
    assert counter.calls == 0


def _refused(model, ids, cache, match, **kwargs):
    with pytest.raises(UnsupportedGenerationError, match=match):
        generate(model, ids, cache, **kwargs)


def test_cache_longer_than_input(llama, make_prompt, forward_counter):
    ids = make_prompt(100, seed=11)
    cache = prefilled(llama, ids)
    counter = forward_counter(llama)
    try:
        _refused(llama, ids, cache, r"holds 100 tokens and input_ids has 100.*at least one new one")
    finally:
        counter.remove()
    assert cache.get_seq_length() == 100


def test_cache_of_another_model(llama, make_prompt, model_factory, forward_counter):
    ids = make_prompt(60, seed=12)
    other = model_factory("llama_gqa", num_layers=3, seed=9, enable=False)
    mha = model_factory("llama_mha", num_layers=2, seed=9, enable=False)
    for cache, match in ((prefilled(other, ids[:, :40]), "3 layers"), (prefilled(mha, ids[:, :40]), "KV heads")):
        counter = forward_counter(llama)
        try:
            _refused(llama, ids, cache, f"cannot run here: it holds .*{match}.*made by another model")
        finally:
            counter.remove()


def test_cache_in_another_dtype(llama, make_prompt, forward_counter):
    ids = make_prompt(60, seed=13)
    cache = prefilled(llama, ids[:, :40])
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.double(), layer.values.double()
    counter = forward_counter(llama)
    try:
        _refused(llama, ids, cache, "float64")
    finally:
        counter.remove()


def test_unusable_cache_kinds(llama, watched, make_prompt, model_factory):
    ids = make_prompt(60, seed=14)
    sliding = model_factory("mistral", seed=2, enable=False)
    sliding.config.sliding_window = 16
    caches = {
        "offloaded": DynamicCache(config=llama.config, offloading=True),
        "another model's sliding layers": DynamicCache(config=sliding.config),  # llama's layers attend in full
    }
    for cache in caches.values():
        _refused(llama, ids, cache, "it is a DynamicCache")
    quantized = QuantizedCache.__new__(QuantizedCache)  # no quantization backend is installed; the type is the point
    quantized.layers = []
    quantized._is_user_defined = True
    _refused(llama, ids, quantized, "it is a QuantizedCache")


def test_a_sliding_model_s_own_cache_is_served(make_prompt, model_factory):
    """``DynamicCache(config=model.config)`` of a sliding-window model (its sliding layers keep only their window),
    prefilled by the model's forward over 48 tokens (three 16-token windows): served, and left as plain
    ``generate()`` leaves it."""
    sliding = model_factory("mistral", seed=2, enable=False)
    sliding.config.sliding_window = 16
    hf_triforce.enable(sliding)
    ids = make_prompt(64, seed=14)
    cache = prefilled(sliding, ids[:, :48])
    assert all(layer.is_sliding for layer in cache.layers)
    mine, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    out = generate(sliding, ids, mine)
    plain = generate(sliding, ids, theirs, triforce=False)
    assert torch.equal(out.sequences, plain.sequences)
    assert output_cache(out) is mine and hf_triforce.last_stats(sliding).reused_tokens == 48
    assert_same_cache(mine, theirs)


@pytest.mark.parametrize("implementation", ["static", "offloaded", "quantized"])
def test_cache_implementation_is_refused(llama, watched, make_prompt, implementation):
    with pytest.raises(UnsupportedGenerationError, match=f"cache_implementation='{implementation}'"):
        llama.generate(
            make_prompt(40, seed=15), max_new_tokens=4, cache_implementation=implementation,
            triforce_config=TriForceConfig(**CFG),
        )  # fmt: skip


@pytest.mark.parametrize(
    "processors, drafter",
    [pytest.param({"temperature": 0.7}, "none", id="temperature0.7-none"),
     pytest.param({"top_p": 0.8}, "model", id="top_p0.8-model")],
)  # fmt: skip
def test_sampled_calls_from_a_prefilled_cache_draw_what_fresh_calls_draw(sampler, processors, drafter):
    """Sampled (the sampling tests' tiny model and sparse view), each call given a deep copy of a cache holding 90 of
    the 100 prompt tokens draws, seed for seed, the tokens of the same call prefilling all 100 itself: so it has the
    distribution ``test_sampling_distribution.py`` tests. The cached tokens were reused and every level's rejection
    rule ran over the seeds."""
    cached = PROMPT_LENGTH - 10
    with one_thread():
        fresh, _ = sampler.triforce(processors, drafter, seeds=SAME_SEEDS)
        reused, totals = sampler.triforce(processors, drafter, cached=cached, seeds=SAME_SEEDS)
    same_tokens(reused, fresh, f"a prefilled cache of {cached} tokens")
    assert totals["reused_tokens"] == cached, totals
    check_paths(totals, drafter)
