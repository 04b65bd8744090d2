"""The verification's and level-1 steps' attention: what the split-KV kernel assumes, and TriForce through it.

:func:`hf_triforce.hf.attention._use_split_kv` sends TriForce's masked multi-token forwards on CUDA (the
verification, and level-1 steps over a dynamic view through ``view_attention``) to
:func:`~hf_triforce.kernels.verification.verify_attention`, which computes the bottom-right causal mask
instead of reading the one transformers built. The first test checks, on every such forward of real
generate() calls, that transformers' mask is exactly that; the second forces the kernel path on the CPU
(Triton's interpreter) and checks TriForce's greedy output against plain generate().
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce.hf.attention as integration
import hf_triforce.kernels.verification as kv
from hf_triforce import TriForceConfig
from hf_triforce.kernels.attention import _bottom_right_causal
from hf_triforce.kernels.verification import MAX_ROWS

pytestmark = pytest.mark.integration

CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, gamma1=2, gamma2=4, adaptive=False)


@pytest.mark.parametrize("family", ["llama_gqa", "llama_mha", "mistral", "qwen3"])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_verification_and_view_masks_are_bottom_right_causal(zoo, make_prompt, monkeypatch, assert_greedy_equal,
                                                             family, drafter, transformers_level1):  # fmt: skip
    seen = []

    def spy(base, query, key, mask, kwargs):
        seen.append((query.shape[2], key.shape[2], mask))
        return False

    monkeypatch.setattr(integration, "_use_split_kv", spy)
    monkeypatch.setattr(integration, "triton_enabled", lambda *tensors: True)  # level-1 steps wrapped, as on CUDA
    prompt = make_prompt(260, seed=3, repetitive=drafter == "ngram")
    # transformers_level1: the level-1 steps a CUDA model runs (the plan takes the direct forward on the CPU only)
    cfg = TriForceConfig(drafter=drafter, **CFG)
    assert_greedy_equal(zoo.target(family), prompt, cfg, 30)
    masked = [(q, k, m) for q, k, m in seen if q > 1 and m is not None]
    assert any(k >= 260 for _, k, _ in masked), "no masked multi-token verification forward was seen"
    if drafter == "ngram":  # level-1 steps verifying level-0 drafts over the (shorter) retrieval view
        assert any(k < 260 for _, k, _ in masked), "no masked multi-token level-1 forward was seen"
    for q_len, kv_len, mask in masked:
        expected = _bottom_right_causal(q_len, kv_len, mask.device)
        allowed = mask if mask.dtype == torch.bool else mask == 0
        assert torch.equal(allowed.expand_as(expected.expand(*allowed.shape[:2], -1, -1)), expected.expand_as(allowed))


def _force_the_kernel(monkeypatch) -> None:
    """The split-KV kernel wherever CUDA would take it, run by Triton's interpreter on the CPU."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("HF_TRIFORCE_DISABLE_TRITON", raising=False)
    monkeypatch.setattr(integration, "triton_enabled", lambda *tensors: True)  # as on CUDA
    monkeypatch.setattr(kv, "triton_enabled", lambda *tensors: True)


@pytest.mark.parametrize("family,chunk", [("llama_gqa", 80), ("llama_mha", 48)])
def test_triforce_through_the_split_kv_kernel(model_factory, make_prompt, monkeypatch, assert_greedy_equal, family,
                                              chunk, transformers_level1):  # fmt: skip
    """Verifications, level-1 steps with level-0 drafts, and prefill chunks of at most MAX_ROWS rows (tokens x
    group) go through the kernel."""
    _force_the_kernel(monkeypatch)
    calls = []
    kernel = kv.verify_attention_triton

    def counted(*args, **kwargs):
        calls.append((args[0].shape[2], args[1].shape[2]))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(kv, "verify_attention_triton", counted)
    model = model_factory(family, seed=11)
    cfg = TriForceConfig(drafter="ngram", prefill_chunk_size=chunk, **CFG)
    assert_greedy_equal(model, make_prompt(100, seed=8, repetitive=True), cfg, 10)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    launches = [q for q, _ in calls]
    assert CFG["gamma2"] + 1 in launches and min(launches) > 1, calls
    assert (chunk in launches) == (chunk * group <= MAX_ROWS), calls  # GQA: 80 x 2 rows stay on sdpa
    assert any(keys < 100 for _, keys in calls), "level-1 steps over the view should use the kernel too"
