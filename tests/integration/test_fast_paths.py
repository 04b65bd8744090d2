"""The CPU fast path for the full-cache verification is really taken, and only where it should be."""

from __future__ import annotations

import pytest

import hf_triforce.hf.attention as integration
from hf_triforce import TriForceConfig

pytestmark = pytest.mark.integration

CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, drafter="none", adaptive=False)


@pytest.fixture
def grouped_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(integration, "gqa_sdpa_attention", _counting(calls))
    return calls


def _counting(calls):
    from hf_triforce.kernels.attention import gqa_sdpa_attention

    def spy(module, query, key, value, mask, **kwargs):
        calls.append(query.shape[2])
        return gqa_sdpa_attention(module, query, key, value, mask, **kwargs)

    return spy


def test_verification_of_gqa_model_uses_grouped_sdpa(zoo, make_prompt, grouped_calls, assert_greedy_equal):
    model = zoo.target("llama_gqa")
    assert_greedy_equal(model, make_prompt(200, seed=5), TriForceConfig(**CFG), 20)
    assert grouped_calls, "the multi-token full-cache verification should use gqa_sdpa_attention"
    assert all(q > 1 for q in grouped_calls)  # single-token steps keep transformers' path
    assert 200 not in grouped_calls  # the prefill keeps transformers' own (unmasked, causal) path


def test_mha_model_keeps_transformers_sdpa(zoo, make_prompt, grouped_calls, assert_greedy_equal):
    assert_greedy_equal(zoo.target("llama_mha"), make_prompt(200, seed=5), TriForceConfig(**CFG), 20)
    assert not grouped_calls
