"""Level 1's direct forward (``hf_triforce.hf.direct_forward``) against the model's own forward, and its wiring.

The decoder must compute what the model's forward computes over the same cache (float32 tolerance with the
model's weights, bfloat16 tolerance with the int8 copy, checked against the model's forward with its layers
patched to the per-layer int8 copy), for every layout it serves: separate and fused projections, biases, per-head
norms, partial RoPE. The greedy and sampling suites run it too (the plan runs it on these CPU models); the tests
here check that the plan's choice is the forward that runs, and that it is not chosen where it cannot run.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hf import direct_forward
from hf_triforce.hf.direct_forward import _DECODERS, DirectDecoder, direct_decoder, direct_forward_problem
from hf_triforce.hf.linears import int8_weight_copy, level1_linears, swapped_linears
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.kernels.int4_linear import int4_kernel_available, quantize_int4
from hf_triforce.kernels.int8_linear import int8_kernel_available, quantize_int8
from hf_triforce.kernels.verify_cpu import verify_attention_cpu

pytestmark = pytest.mark.integration

SMALL = dict(chunk_size=8, retrieval_budget=48, recent_window=16, gamma1=2, gamma2=5, adaptive=False)
needs_int8 = pytest.mark.skipif(not int8_kernel_available(), reason="torch has no _weight_int8pack_mm")


LAYOUTS = ("llama_gqa", "llama_mha", "mistral", "qwen2", "qwen3", "phi3")


def prefilled_pair(model, prompt: torch.LongTensor) -> tuple[DynamicCache, DynamicCache]:
    """Two caches holding the same ``[1, L]`` prompt."""
    caches = []
    for _ in range(2):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt, **cache_kwargs(cache), use_cache=True)
        caches.append(cache)
    return caches[0], caches[1]


def model_logits(model, tokens: torch.Tensor, position: int, cache) -> torch.Tensor:
    positions = torch.arange(position, position + tokens.shape[0])[None]
    with torch.no_grad():
        out = model(input_ids=tokens[None], position_ids=positions, **cache_kwargs(cache), use_cache=True)
    return out.logits[0].float()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("width", [1, 3])
def test_equals_the_models_forward_over_the_same_cache(model_factory, make_prompt, layout, width):
    model = model_factory(layout)
    ours, theirs = prefilled_pair(model, make_prompt(40, seed=4))
    tokens = make_prompt(width, seed=9)[0]
    with torch.no_grad():
        got = DirectDecoder(model, weights="full").logits(tokens, 40, ours)
    expected = model_logits(model, tokens, 40, theirs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.layers, theirs.layers, strict=True):  # the same keys/values were appended
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["llama_gqa", "llama_mha"])
def test_key_ranges_equal_the_models_forward(model_factory, make_prompt, monkeypatch, layout):
    """A few-token step over a long view runs its keys as ranges of one SDPA call (from ``RANGES_FROM_KEYS`` keys);
    here from any length, two ranges, so a tiny model's cache takes that path: the same logits as the model's."""
    calls = []

    def two_ranges(*args):
        out = verify_attention_cpu(*args, parts=2)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(direct_forward, "RANGES_FROM_KEYS", 1)
    monkeypatch.setattr(direct_forward, "verify_attention_cpu", two_ranges)
    model = model_factory(layout)
    ours, theirs = prefilled_pair(model, make_prompt(40, seed=4))
    tokens = make_prompt(3, seed=9)[0]
    with torch.no_grad():
        got = DirectDecoder(model, weights="full").logits(tokens, 40, ours)
    assert calls == [True] * model.config.num_hidden_layers
    torch.testing.assert_close(got, model_logits(model, tokens, 40, theirs), rtol=1e-4, atol=1e-4)


@needs_int8
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("width", [1, 3])
def test_int8_equals_the_models_forward_with_the_int8_copy(model_factory, make_prompt, layout, width):
    """Stacking q|k|v and gate|up before quantizing per output row gives each layer's own int8 copy: the fused
    products equal the model's forward with every linear patched to its int8 copy (bfloat16 rounding apart)."""
    model = model_factory(layout)
    ours, theirs = prefilled_pair(model, make_prompt(40, seed=4))
    tokens = make_prompt(width, seed=9)[0]
    with torch.no_grad():
        got = DirectDecoder(model, weights="int8").logits(tokens, 40, ours)
        with swapped_linears([model], int8_weight_copy(model)), level1_linears():
            expected = model_logits(model, tokens, 40, theirs)
    scale = expected.abs().max()
    torch.testing.assert_close(got, expected, rtol=0, atol=float(2e-2 * scale))  # bfloat16: 8 bits of mantissa


needs_int4 = pytest.mark.skipif(not int4_kernel_available(), reason="torch has no _weight_int4pack_mm_for_cpu")


@needs_int4
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("width", [1, 3])
def test_int4_equals_the_models_forward_with_the_weights_it_stands_for(model_factory, make_prompt, layout, width):
    """With weights='int4' the decoder layers' projections multiply by their int4 copy and the LM head by its int8
    copy: the model's own forward with each of those weights replaced by what its copy stands for (de-quantized;
    quantizing stacked q|k|v per group of inputs quantizes each layer alike) gives the same logits, bfloat16
    rounding of the activations apart."""
    model = model_factory(layout)
    ours, theirs = prefilled_pair(model, make_prompt(40, seed=4))
    tokens = make_prompt(width, seed=9)[0]
    with torch.no_grad():
        got = DirectDecoder(model, weights="int4").logits(tokens, 40, ours)
        for layer in model.model.layers:
            for linear in (m for m in layer.modules() if isinstance(m, torch.nn.Linear)):
                linear.weight.copy_(quantize_int4(linear.weight).dequantize())
        model.lm_head.weight.copy_(quantize_int8(model.lm_head.weight).dequantize())
        expected = model_logits(model, tokens, 40, theirs)
    scale = expected.abs().max()
    # bfloat16 (8 bits of mantissa) rounds the activations on our side only, at each of a layer's four products
    torch.testing.assert_close(got, expected, rtol=0, atol=float(4e-2 * scale))


def test_over_a_retrieval_view_equals_the_models_forward_over_it(llama, make_prompt):
    """The real use: one level-1 step over a sparse view of the full cache, both ways, from the same selection."""
    from hf_triforce.caches.retrieval import RetrievalCache
    from hf_triforce.hf.attention import QueryCapture, capturing_queries

    cache, capture = RetrievalCache(num_layers=2, chunk_size=8), QueryCapture()
    prompt = make_prompt(96, seed=2)
    with torch.no_grad(), capturing_queries(llama, capture, keep=1) as kwargs:
        llama(input_ids=prompt, **cache_kwargs(cache), use_cache=True, **kwargs)
    indices = cache.select(capture.at(-1), 48, 16)
    tokens = make_prompt(3, seed=5)[0]
    views = [cache.sparse_view(indices, 16) for _ in range(2)]
    with torch.no_grad():
        got = DirectDecoder(llama).logits(tokens, 96, views[0])
    expected = model_logits(llama, tokens, 96, views[1])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["llama_gqa", "qwen2", "phi3"])
@pytest.mark.parametrize("forward", ["direct", "transformers"])
def test_greedy_equals_plain_generate(model_factory, layout, forward, make_prompt, assert_greedy_equal, request):
    model = model_factory(layout)
    if forward == "transformers":
        request.getfixturevalue("transformers_level1")
    cfg = TriForceConfig(drafter="ngram", **SMALL)
    assert_greedy_equal(model, make_prompt(120, seed=3, repetitive=True), cfg, 40)
    stats = hf_triforce.last_stats(model)
    assert stats.level1_forward == forward and stats.level1.drafted > 0


def test_auto_is_direct_on_the_cpu(llama, make_prompt):
    llama.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=TriForceConfig(**SMALL))
    assert hf_triforce.last_stats(llama).level1_forward == "direct"


@pytest.mark.parametrize("forward", ["direct", "transformers"])
def test_only_the_chosen_forward_runs_level1(llama, make_prompt, monkeypatch, forward, request):
    """With the direct forward, the model's forward never runs over a retrieval view (level 1's steps); with
    transformers', it does, and the direct decoder never runs."""
    if forward == "transformers":
        request.getfixturevalue("transformers_level1")
    from hf_triforce.caches.view import RetrievalView
    from hf_triforce.hf import direct_forward

    over_view, direct_calls = [], []
    real_forward, real_logits = type(llama).forward, direct_forward.DirectDecoder.logits

    def counting_forward(self, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        over_view.append(isinstance(cache, RetrievalView))
        return real_forward(self, *args, **kwargs)

    def counting_logits(self, *args, **kwargs):
        direct_calls.append(1)
        return real_logits(self, *args, **kwargs)

    monkeypatch.setattr(type(llama), "forward", counting_forward)
    monkeypatch.setattr(direct_forward.DirectDecoder, "logits", counting_logits)
    cfg = TriForceConfig(drafter="none", **SMALL)
    llama.generate(make_prompt(80), max_new_tokens=20, do_sample=False, triforce_config=cfg)
    assert hf_triforce.last_stats(llama).level1_forward == forward
    level1_steps = hf_triforce.last_stats(llama).phases.calls["level1"]
    assert level1_steps > 0
    assert sum(over_view) == (level1_steps if forward == "transformers" else 0)
    assert len(direct_calls) == (level1_steps if forward == "direct" else 0)


def test_decoder_is_kept_and_remade_after_a_weight_update(model_factory):
    model = model_factory("llama_gqa")
    decoder = direct_decoder(model, "full")
    assert direct_decoder(model, "full") is decoder
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    assert direct_decoder(model, "full") is not decoder


def test_disable_frees_the_decoder(model_factory, make_prompt):
    model = model_factory("llama_gqa")
    model.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=TriForceConfig(**SMALL))
    assert model in _DECODERS
    hf_triforce.disable(model)
    assert model not in _DECODERS


class _QuantizedLinear(torch.nn.Linear):
    """Stands for an integration's own linear class (bitsandbytes, quanto...): a subclass of nn.Linear."""


def test_a_model_with_subclassed_linears_runs_transformers_forward(model_factory, make_prompt):
    model = model_factory("llama_gqa")
    old = model.model.layers[0].self_attn.q_proj
    new = _QuantizedLinear(old.in_features, old.out_features, bias=False)
    new.load_state_dict(old.state_dict())
    model.model.layers[0].self_attn.q_proj = new
    assert "not plain nn.Linear" in direct_forward_problem(model)
    model.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=TriForceConfig(**SMALL))
    assert hf_triforce.last_stats(model).level1_forward == "transformers"
