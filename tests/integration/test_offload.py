"""``TriForceConfig(offload_kv=True)``: the full cache in host storage, read on the device only through explicit copies.

On the CPU the host and the device are the same memory, so the offloaded storage hands out no tensors at all
(:class:`~hf_triforce.caches.offload.HostKVBuffer`): every read is an explicit copy, counted. Checked here: greedy
output equal to plain ``generate()`` on 4-layer models (more layers than the two device buffers, so every
verification streams every layer), with every level-0 drafter, fixed-shape steps, a batch, a reused cache and a
chunked prefill; the transfers: each verification copies each layer once, a level-1 step copies nothing, the new
tokens go back to the host; the refusals. Sampled: seed for seed, the tokens of the same call without offloading
(:func:`test_sampled_calls_draw_what_they_draw_without_offloading`), whose distribution
``test_sampling_distribution.py`` tests.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

import hf_triforce
from hf_triforce import RetrievalCache, TriForceConfig, UnsupportedGenerationError, UnsupportedModelError
from hf_triforce.caches import offload
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs, output_cache
from hf_triforce.hierarchy.level1 import Level1Drafter
from tests.integration.conftest import build_model
from tests.integration.test_batches import check_rows, left_padded
from tests.support.sampled_runs import check_paths, one_thread, same_tokens
from tests.support.speculation import Ran

pytestmark = pytest.mark.integration

CFG = dict(retrieval_budget=64, chunk_size=8, recent_window=16, gamma1=2, gamma2=6, adaptive=False, offload_kv=True,
           draft_cache_budget=48)  # fmt: skip
REJECTED = Ran(rejected=("level1",))
LAYERS = 4  # more than the two device buffers: every verification copies every layer


SAME_SEEDS = range(100)
"""Seeds of the sampled same-tokens test (``torch.manual_seed(i)`` for call ``i``)."""


@pytest.fixture(scope="module")
def model():
    return build_model("llama_gqa", num_layers=LAYERS, seed=9)


@pytest.fixture(scope="module")
def draft():
    return build_model("llama_gqa", num_layers=1, seed=109, enable=False)


@pytest.fixture
def copies(monkeypatch) -> dict[str, list[bool]]:
    """Each explicit copy out of host storage, by kind: whether a level-1 step was running when it was made."""
    seen: dict[str, list[bool]] = {"layer": [], "read": [], "gather": [], "chunks": []}
    in_level1 = [False]
    step = Level1Drafter._level1_step

    def level1_step(self, *args, **kwargs):
        in_level1[0] = True
        try:
            return step(self, *args, **kwargs)
        finally:
            in_level1[0] = False

    monkeypatch.setattr(Level1Drafter, "_level1_step", level1_step)
    for kind, name in (("layer", "copy_into"), ("read", "read"), ("gather", "gather"), ("chunks", "gather_chunk_keys")):
        original = getattr(offload.HostKVBuffer, name)

        def recorded(self, *args, _original=original, _kind=kind, **kwargs):
            seen[_kind].append(in_level1[0])
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(offload.HostKVBuffer, name, recorded)
    return seen


@pytest.mark.parametrize("drafter", ["ngram", "none", "model"])
def test_greedy_equals_plain_generate(model, draft, make_prompt, assert_greedy_equal, drafter):
    prompt = make_prompt(220, seed=2, repetitive=drafter == "ngram")
    assistant = {"assistant_model": draft} if drafter == "model" else {}
    assert_greedy_equal(model, prompt, TriForceConfig(drafter=drafter, **CFG), 40, ran=REJECTED, **assistant)
    stats = hf_triforce.last_stats(model)
    assert stats.kv_bytes_to_device > 0 and stats.kv_bytes_to_host > 0


def test_each_verification_streams_each_layer_once_and_level1_reads_nothing(model, make_prompt, copies):
    """Each full-cache forward after the prefill copies every layer's cached keys and values to the device once (the
    next forward's first layer while the last one computes); no level-1 step copies anything; what a refresh reads
    is its selection, the nominated chunks' keys and the new chunks' keys."""
    prompt = make_prompt(300, seed=3)
    model.generate(prompt, max_new_tokens=40, do_sample=False, triforce_config=TriForceConfig(drafter="none", **CFG))
    stats = hf_triforce.last_stats(model)
    assert len(copies["layer"]) == LAYERS * stats.target_forwards + 1  # + the last forward's prefetch of layer 0
    assert not any(flag for flags in copies.values() for flag in flags), "a level-1 step read the full cache"
    assert copies["gather"] and copies["chunks"]  # refreshes: the view's tokens, the nominees' keys
    layer_bytes = prompt.shape[1] * 2 * 16 * 4 * 2  # tokens x KV heads x head dim x float32 x (keys, values)
    assert stats.kv_bytes_to_device >= LAYERS * stats.target_forwards * layer_bytes
    new = stats.new_tokens + prompt.shape[1] - 1  # every token the cache holds went to the host once, or more (drafts)
    assert stats.kv_bytes_to_host >= LAYERS * new * 2 * 16 * 4 * 2


@pytest.mark.parametrize("options", [{"cuda_graphs": "eager"}, {"prefill_chunk_size": 64}, {"rescore_candidates": 0}])
def test_other_paths(model, make_prompt, assert_greedy_equal, options):
    """Fixed-shape level-1 steps, a chunked prefill (each chunk streams the chunks before it), chunk means only."""
    cfg = TriForceConfig(drafter="ngram", **{**CFG, **options})
    assert_greedy_equal(model, make_prompt(240, seed=4, repetitive=True), cfg, 32, ran=REJECTED)


def test_a_batch(model, assert_ran):
    ids, mask = left_padded([260, 200, 230], repeat=True)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    got = model.generate(ids, triforce_config=TriForceConfig(drafter="ngram", **CFG), **kwargs)
    check_rows(model.generate(ids, **kwargs), got)
    assert_ran(model, rejected=("level1",))
    assert hf_triforce.last_stats(model).kv_bytes_to_device > 0


def test_a_reused_cache_and_the_returned_one(model, make_prompt, assert_ran):
    """From a caller's ``DynamicCache`` (copied into host storage, extended as plain ``generate()`` extends it), then
    from the offloaded cache a call returned (used in place): plain ``generate()``'s tokens every time."""
    prompt = make_prompt(260, seed=6)
    prefix = DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt[:, :200], use_cache=True, **cache_kwargs(prefix))
    common = dict(max_new_tokens=24, do_sample=False)
    expected = model.generate(prompt, **common, **{CACHE_ARG: copy.deepcopy(prefix)})
    cfg = TriForceConfig(drafter="none", **CFG)
    out = model.generate(prompt, triforce_config=cfg, return_dict_in_generate=True, **common, **{CACHE_ARG: prefix})
    assert torch.equal(expected, out.sequences) and prefix.get_seq_length() == out.sequences.shape[1] - 1
    out = model.generate(prompt, triforce_config=cfg, return_dict_in_generate=True, **common)
    returned = output_cache(out)
    assert isinstance(returned, RetrievalCache) and returned.transfers is not None
    more = torch.cat([out.sequences, make_prompt(5, seed=7)], dim=1)
    again = model.generate(more, triforce_config=cfg, **common, **{CACHE_ARG: returned})
    assert torch.equal(model.generate(more, **common), again)
    assert hf_triforce.last_stats(model).reused_tokens == out.sequences.shape[1] - 1
    assert_ran(model)


def test_offloaded_storage_hands_out_no_host_tensors(model, make_prompt):
    model.generate(make_prompt(100), max_new_tokens=4, triforce_config=TriForceConfig(**CFG))
    cache = RetrievalCache(2, 8, 64, offload_to=torch.device("cpu"))
    _ = cache.update(torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8), 0)
    with pytest.raises(AttributeError, match="no host tensors"):
        _ = cache.layers[0].buffer.keys
    keys, _ = cache.layers[0].buffer.read(0, 16)
    assert keys.shape == (1, 2, 16, 8) and cache.transfers.to_device == 16 * 2 * 8 * 4 * 2


def test_refusals(model, make_prompt, forward_counter):
    model.hf_device_map = {"": "cpu", "model.layers.1": "disk"}  # as accelerate marks a dispatched model
    counter = forward_counter(model)
    try:
        with pytest.raises(UnsupportedModelError, match="dispatched by accelerate"):
            model.generate(make_prompt(40), max_new_tokens=4, triforce_config=TriForceConfig(offload_kv=True))
    finally:
        del model.hf_device_map
        counter.remove()
    assert counter.calls == 0


def test_sampled_calls_draw_what_they_draw_without_offloading(sampler):
    """Sampled (temperature 0.9, top-p 0.9, the draft model at level 0, the sparse view of the sampling tests), each
    seed gives the very tokens of the call without ``offload_kv``: offloading moves the full cache, not what is
    computed, so the offloaded path has the distribution ``test_sampling_distribution.py`` tests. Every level's
    rejection rule ran over the seeds, and the calls copied the cache to the device."""
    processors = {"temperature": 0.9, "top_p": 0.9}
    with one_thread():
        on_device, _ = sampler.triforce(processors, "model", seeds=SAME_SEEDS)
        offloaded, totals = sampler.triforce(processors, "model", options={"offload_kv": True}, seeds=SAME_SEEDS)
    same_tokens(offloaded, on_device, "offload_kv=True")
    check_paths(totals, "model")
    assert totals["kv_bytes_to_device"] > 0, totals


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("options", [{}, {"cuda_graphs": True}])
def test_on_cuda_the_cache_lives_in_pinned_host_memory(make_prompt, assert_greedy_equal, options):
    """On a GPU (float32): the host storage is pinned, each verification streams every layer on the side stream,
    and the output is plain ``generate()``'s."""
    model = build_model("llama_gqa", num_layers=LAYERS, seed=9).to("cuda")
    prompt = make_prompt(300, seed=8).to("cuda")
    assert_greedy_equal(model, prompt, TriForceConfig(drafter="ngram", **{**CFG, **options}), 32, ran=REJECTED)
    stats = hf_triforce.last_stats(model)
    assert stats.kv_bytes_to_device > 0 and stats.kv_bytes_to_host > 0


@pytest.mark.parametrize("where", ["host", "device"])
def test_a_call_that_cannot_fit_is_refused_with_the_longest_that_fits(model, make_prompt, forward_counter, monkeypatch,
                                                                      where):  # fmt: skip
    """With ``offload_kv`` the host holds the whole cache, the device what streams: a call that fits neither is refused
    before any forward, naming the longest ``max_length`` that fits; that one runs."""
    from hf_triforce.generation import offload_fit

    per_token = LAYERS * 2 * 2 * 16 * 4  # layers x (K, V) x KV heads x head dim x float32
    if where == "host":
        monkeypatch.setattr(offload_fit, "host_available_bytes", lambda: 300 * per_token)
    else:  # as on a GPU with little free memory (on the CPU there is no device check otherwise)
        monkeypatch.setattr(offload_fit, "device_free_bytes", lambda device: 400 * per_token)
    prompt, cfg = make_prompt(200), TriForceConfig(drafter="ngram", **CFG)
    counter = forward_counter(model)
    with pytest.raises(UnsupportedGenerationError, match="longest that fits is max_length=") as info:
        model.generate(prompt, max_new_tokens=400, triforce_config=cfg)
    counter.remove()
    assert counter.calls == 0
    longest = int(str(info.value).split("max_length=")[1].split(".")[0])
    assert 200 < longest < 600
    model.generate(prompt, max_length=longest, triforce_config=cfg)
