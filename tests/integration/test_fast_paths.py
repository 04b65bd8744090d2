"""The CPU fast paths for the full-cache verification are really taken, and only where they should be: TriForce's
multi-token verifications go to the verification route (key ranges where they pay, else the grouped reference),
never single-token steps or the prefill, and the key ranges keep greedy output equal to plain generate()."""

from __future__ import annotations

import pytest

import hf_triforce.hf.attention as integration
import hf_triforce.kernels.verify_cpu as verify_cpu
from hf_triforce import TriForceConfig

pytestmark = pytest.mark.integration

CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, drafter="none", adaptive=False)


@pytest.fixture
def routes(monkeypatch):
    """Query lengths of the forwards each route took: ``"verification"`` (``verify_attention``) and ``"grouped"``
    (``gqa_sdpa_attention`` called by the attention wrapper itself)."""
    calls = {"verification": [], "grouped": []}
    verify, grouped = integration.verify_attention, integration.gqa_sdpa_attention

    def verify_spy(query, key, value, scale=None):
        calls["verification"].append(query.shape[2])
        return verify(query, key, value, scale)

    def grouped_spy(module, query, key, value, mask, **kwargs):
        calls["grouped"].append(query.shape[2])
        return grouped(module, query, key, value, mask, **kwargs)

    monkeypatch.setattr(integration, "verify_attention", verify_spy)
    monkeypatch.setattr(integration, "gqa_sdpa_attention", grouped_spy)
    return calls


@pytest.mark.parametrize("family", ["llama_gqa", "llama_mha"])
def test_multi_token_verifications_take_the_verification_route(zoo, make_prompt, routes, assert_greedy_equal, family):
    assert_greedy_equal(zoo.target(family), make_prompt(200, seed=5), TriForceConfig(**CFG), 20)
    assert routes["verification"], "the multi-token full-cache verification should take verify_attention"
    assert all(q > 1 for q in routes["verification"])  # single-token steps keep transformers' path
    assert 200 not in routes["verification"]  # the prefill keeps transformers' own (unmasked, causal) path
    assert not routes["grouped"]


def test_key_ranges_keep_greedy_output_equal(zoo, make_prompt, monkeypatch, assert_greedy_equal):
    """Ranges forced at a short context (three of them wherever 96 keys allow): the verification runs them and the
    text equals plain generate()'s."""
    ran = []
    ranges = verify_cpu.verify_attention_cpu

    def counted(*args, **kwargs):
        out = ranges(*args, **kwargs)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(verify_cpu, "cpu_key_parts", lambda heads, length, threads=None: 3 if length >= 96 else 1)
    monkeypatch.setattr("hf_triforce.kernels.verification.verify_attention_cpu", counted)
    assert_greedy_equal(zoo.target("llama_gqa"), make_prompt(200, seed=5), TriForceConfig(**CFG), 20)
    assert ran and all(ran)
