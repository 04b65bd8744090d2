"""Sliding-window layers of TriForce's full cache hold their window, as plain ``generate()``'s cache does.

A sliding layer of the ``RetrievalCache`` is a :class:`~hf_triforce.caches.sliding.SlidingLayer`: it keeps the last
``window - 1`` tokens and, within a round, that round's tokens until the verification's crop. Checked here on the
sliding and hybrid shapes (every layer sliding: Mistral; alternating: gpt-oss; five sliding to one full: Gemma 3),
prompts several windows long: greedy output equal to plain ``generate()`` (chains, fixed shapes, offload_kv, a
batch), the bound on what a sliding layer holds after every round, the caches transformers makes for these models
reused (one row and a batch), the returned cache serving a later plain ``generate()`` and a later TriForce call,
and the full cache's bytes against plain ``generate()``'s.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import DynamicCache

import hf_triforce
from hf_triforce import RetrievalCache, TriForceConfig
from hf_triforce.caches.buffers import KVBuffer
from hf_triforce.caches.sliding import SlidingLayer
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs, output_cache
from tests.support.families import BY_TYPE, WINDOW, build

pytestmark = pytest.mark.integration

SHAPES = ("mistral", "gpt_oss", "gemma3_text")
CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False, drafter="ngram",
           gamma1=2, gamma2=4, draft_cache_budget=48)  # fmt: skip
PROMPT = 5 * WINDOW  # five windows
NEW = 24
ROUND = CFG["gamma1"] + CFG["gamma2"] + 1  # a round's widest verification


def model_of(shape: str, window: int = WINDOW, layers: int = 4) -> torch.nn.Module:
    """A tiny model of ``shape`` with ``window``-token sliding layers (Gemma 3: five sliding layers to one full)."""
    family = BY_TYPE[shape]
    config = {**family.config, "sliding_window": window}
    if shape == "gemma3_text":
        config["layer_types"] = (["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6 + 1)
    if shape == "gpt_oss":
        config["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    return build(dataclasses.replace(family, config=config), num_layers=layers, seed=SHAPES.index(shape))


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {shape: hf_triforce.enable(model_of(shape, layers=6 if shape == "gemma3_text" else 4)) for shape in SHAPES}


def prompt_ids(length: int = PROMPT, seed: int = 0, rows: int = 1) -> torch.LongTensor:
    return torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def held(monkeypatch) -> list[int]:
    """The most tokens any sliding layer held after each of its updates within a call's rounds."""
    seen: list[int] = []
    update = SlidingLayer.update

    def record(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        if self.record_past:
            seen.append(self.buffer.length)
        return out

    monkeypatch.setattr(SlidingLayer, "update", record)
    return seen


@pytest.mark.parametrize("form", ["chains", "fixed shapes", "offload_kv"])
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_equals_plain_generate_and_sliding_layers_hold_their_window(models, held, runners, shape, form):
    model = models[shape]
    extra = {"fixed shapes": {"cuda_graphs": "eager"}, "offload_kv": {"offload_kv": True}}.get(form, {})
    common = dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True)
    plain = model.generate(prompt_ids(), **common)
    out = model.generate(prompt_ids(), triforce_config=TriForceConfig(**CFG, **extra), **common)
    assert torch.equal(out.sequences, plain.sequences)
    assert held and max(held) <= WINDOW - 1 + ROUND  # a round's tokens at most, until its verification's crop
    cache = output_cache(out)
    assert isinstance(cache, RetrievalCache)
    sliding = [layer for layer in cache.layers if layer.is_sliding]
    assert sliding and all(layer.buffer.length == WINDOW - 1 for layer in sliding)
    assert all(layer.get_seq_length() == out.sequences.shape[1] - 1 for layer in cache.layers)
    stats = hf_triforce.last_stats(model)
    assert stats.level1.drafted > 0
    if form == "offload_kv":  # the full layers stream from host memory; sliding layers stay on the device
        assert (stats.kv_bytes_to_device > 0) == (len(sliding) < len(cache.layers))
    assert bool(runners) == (form == "fixed shapes")  # level 1 on the fixed-capacity view


@pytest.mark.parametrize("options", [{}, {"offload_kv": True}, {"cuda_graphs": "eager"}])
@pytest.mark.parametrize("shape", SHAPES)
def test_batch_equals_plain_batched_generate(models, held, monkeypatch, shape, options):
    """Two left-padded prompts, four and five windows long: each row as plain batched ``generate()`` (with
    ``offload_kv`` too: the full layers in host memory, the sliding ones on the device); the rows accept unevenly, and
    each sliding layer packs their last tokens, so it holds its window and a round at most."""
    packs = []
    pack = KVBuffer.pack
    monkeypatch.setattr(KVBuffer, "pack", lambda self, slots: (packs.append(slots.shape), pack(self, slots))[1])
    model = models[shape]
    ids = torch.cat(
        [prompt_ids(seed=1), torch.cat([torch.zeros(1, WINDOW, dtype=torch.long), prompt_ids(4 * WINDOW, 2)], 1)]
    )
    mask = torch.ones_like(ids)
    mask[1, :WINDOW] = 0
    common = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **common)
    got = model.generate(ids, triforce_config=TriForceConfig(**CFG, **options), **common)
    assert torch.equal(got, expected)
    assert packs and held and max(held) <= WINDOW - 1 + ROUND  # holes were left, and packed away


@pytest.mark.parametrize("shape", SHAPES)
def test_a_pad_id_inside_the_prompt_is_masked_as_plain_generate_masks_it(models, shape):
    """No attention mask and a prompt holding the pad id: plain ``generate()`` masks those slots (its windows still
    count them); TriForce serves the row as a batch and does the same."""
    model, ids = models[shape], prompt_ids(seed=7).clamp(min=1)
    ids[0, [WINDOW, -WINDOW // 2, -3]] = 0  # one long before the last window, two within it
    common = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **common)
    assert torch.equal(model.generate(ids, triforce_config=TriForceConfig(**CFG), **common), expected)
    assert not torch.equal(model.generate(ids, attention_mask=torch.ones_like(ids), **common), expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_cache_the_model_prefilled_is_reused(models, shape):
    """``DynamicCache(config=model.config)`` (sliding layers keep their window) prefilled by the model's own forward:
    TriForce serves it and leaves it as plain ``generate()`` leaves it."""
    model, prompt = models[shape], prompt_ids(seed=3)
    prefix = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt[:, : 4 * WINDOW], use_cache=True, **cache_kwargs(prefix))
    assert any(layer.is_sliding for layer in prefix.layers)
    mine, theirs = copy.deepcopy(prefix), copy.deepcopy(prefix)
    common = dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True)
    out = model.generate(prompt, triforce_config=TriForceConfig(**CFG), **common, **{CACHE_ARG: mine})
    plain = model.generate(prompt, **common, **{CACHE_ARG: theirs})
    assert torch.equal(out.sequences, plain.sequences)
    assert output_cache(out) is mine
    assert hf_triforce.last_stats(model).reused_tokens == 4 * WINDOW
    for ours, reference in zip(mine.layers, theirs.layers, strict=True):
        assert ours.get_seq_length() == reference.get_seq_length() == out.sequences.shape[1] - 1
        assert ours.keys.shape == reference.keys.shape
        torch.testing.assert_close(ours.keys, reference.keys, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours.values, reference.values, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_batch_cache_the_model_prefilled_is_reused(models, shape):
    """A two-row ``DynamicCache(config=model.config)`` prefilled by the model: a batched call equals plain batched
    ``generate()`` from the same cache."""
    model = models[shape]
    ids = prompt_ids(rows=2, seed=4)
    prefix = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, : 4 * WINDOW], use_cache=True, **cache_kwargs(prefix))
    common = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **common, **{CACHE_ARG: copy.deepcopy(prefix)})
    got = model.generate(ids, triforce_config=TriForceConfig(**CFG), **common, **{CACHE_ARG: copy.deepcopy(prefix)})
    assert torch.equal(got, expected)
    assert hf_triforce.last_stats(model).reused_tokens == 4 * WINDOW


@pytest.mark.parametrize("shape", SHAPES)
def test_the_returned_cache_serves_later_calls(models, shape):
    """TriForce's returned cache (sliding layers holding their window) serves a later plain ``generate()`` and a later
    TriForce call, each equal to plain ``generate()`` over the whole sequence."""
    model = models[shape]
    common = dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True)
    first = model.generate(prompt_ids(seed=5), triforce_config=TriForceConfig(**CFG), **common)
    cache = output_cache(first)
    follow_up = torch.cat([first.sequences, prompt_ids(WINDOW, seed=6)], dim=1)
    expected = model.generate(follow_up, **common).sequences
    plain = model.generate(follow_up, **common, **{CACHE_ARG: copy.deepcopy(cache)})
    assert torch.equal(plain.sequences, expected)
    sliding = [layer for layer in output_cache(plain).layers if layer.is_sliding]
    assert all(layer.buffer.length == WINDOW - 1 for layer in sliding)  # plain decoding keeps the window only
    other_layout = copy.deepcopy(cache)  # another chunk size: copied into a new full cache, handed back after
    again = model.generate(follow_up, triforce_config=TriForceConfig(**CFG), **common, **{CACHE_ARG: cache})
    assert torch.equal(again.sequences, expected)
    assert hf_triforce.last_stats(model).reused_tokens == first.sequences.shape[1] - 1
    config = TriForceConfig(**{**CFG, "chunk_size": 4})
    copied = model.generate(follow_up, triforce_config=config, **common, **{CACHE_ARG: other_layout})
    assert torch.equal(copied.sequences, expected) and output_cache(copied) is other_layout
    assert other_layout.get_seq_length() == expected.shape[1] - 1
    assert all(layer.buffer.length == WINDOW - 1 for layer in other_layout.layers if layer.is_sliding)


def _dynamic_bytes(cache: DynamicCache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _summary_bytes(cache: RetrievalCache) -> int:
    summaries = cache.summaries
    if summaries.shared is not None:
        return summaries.shared.numel() * summaries.shared.element_size()
    return sum(t.numel() * t.element_size() for t in summaries.per_layer if t is not None)


MEMORY_WINDOW = 256


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("windows", [4, 15])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_full_cache_is_no_larger_than_plain_generate_s(monkeypatch, shape, windows, rows):
    """Window 256, prompts 4 and 15 windows long, one row or a batch of two: TriForce's full cache (allocated bytes,
    the most after any round: a batch drops a row's storage once it stops) within 1.05x of plain ``generate()``'s
    cache; the level-1 view and the chunk summaries reported beside it."""
    peak = [0]
    trim = RetrievalCache.trim
    monkeypatch.setattr(RetrievalCache, "trim", lambda self, *a: (trim(self, *a), peak.append(self.kv_nbytes()))[0])
    model = hf_triforce.enable(model_of(shape, MEMORY_WINDOW, layers=6))
    prompt = torch.cat([prompt_ids(windows * MEMORY_WINDOW, seed=7 + row) for row in range(rows)])
    common = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    if rows > 1:  # the prompts hold the pad id: plain generate() masks those slots, and so does TriForce
        common["pad_token_id"] = 0
    plain = model.generate(prompt, **common)
    config = TriForceConfig(**{**CFG, "retrieval_budget": 512, "recent_window": 64, "draft_cache_budget": 256})
    out = model.generate(prompt, triforce_config=config, **common)
    assert torch.equal(out.sequences, plain.sequences)
    stats = hf_triforce.last_stats(model)
    ours, theirs = max(peak), _dynamic_bytes(output_cache(plain))
    print(
        f"\n{shape} window {MEMORY_WINDOW} prompt {rows}x{prompt.shape[1]}: plain {theirs / 2**20:.2f} MiB, "
        f"TriForce full cache {ours / 2**20:.2f} MiB ({ours / theirs:.3f}x), level-1 view "
        f"{stats.view_bytes / 2**20:.2f} MiB"
        + ("" if rows > 1 else f", chunk summaries {_summary_bytes(output_cache(out)) / 2**20:.2f} MiB")
    )
    assert ours <= 1.05 * theirs
