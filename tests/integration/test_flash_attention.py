"""TriForce under flash attention's contract (no mask tensor, bottom-right causal), on the CPU.

transformers' ``flash_attention_3`` path is driven for real (``flash_attention_forward`` ->
``_flash_attention_forward`` -> ``flash_attn_interface.flash_attn_func``); only the kernel at the
bottom is the pure-torch stand-in in ``tests/support/flash_attn_interface.py``. The cache views
TriForce hands the model must then give the same tokens as plain ``generate()`` under the same
kernel, and no forward may fall into the padded (varlen) path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers.modeling_flash_attention_utils as flash_utils

from hf_triforce import TriForceConfig

pytestmark = pytest.mark.integration

CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, gamma1=3, gamma2=4, adaptive=False)


@pytest.fixture
def flash3(monkeypatch):
    """The stand-in kernel importable as ``flash_attn_interface``; transformers' kernel choice reset after."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "support"))
    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    import flash_attn_interface

    flash_attn_interface.CALLS.clear()
    return flash_attn_interface


def _flash(model, monkeypatch):
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_3")
    return model


def test_stand_in_matches_sdpa(model_factory, make_prompt, flash3, monkeypatch):
    """The stand-in kernel computes what sdpa computes: same greedy tokens, close logits."""
    model = model_factory("llama_gqa", seed=3, enable=False)
    prompt = make_prompt(120, seed=2)
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
    with torch.no_grad():
        sdpa_logits = model(prompt).logits
    _flash(model, monkeypatch)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, do_sample=False), expected)
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, sdpa_logits, rtol=1e-4, atol=1e-4)
    assert flash3.CALLS, "transformers did not call the flash kernel"


@pytest.mark.parametrize("family", ["llama_gqa", "llama_mha", "qwen3"])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_triforce_greedy_equals_plain_under_flash(model_factory, make_prompt, flash3, monkeypatch, family, drafter,
                                                  assert_greedy_equal):  # fmt: skip
    model = _flash(model_factory(family, seed=7), monkeypatch)
    prompt = make_prompt(300, seed=4, repetitive=drafter == "ngram")
    assert_greedy_equal(model, prompt, TriForceConfig(drafter=drafter, **CFG), 40)
    queries = {q for q, _ in flash3.CALLS}
    assert CFG["gamma2"] + 1 in queries, "the full-cache verification should run through the flash kernel"


def test_draft_model_under_flash(model_factory, make_prompt, flash3, monkeypatch, assert_greedy_equal):
    """A level-0 draft model with its StreamingLLM cache, both models on flash attention."""
    model = _flash(model_factory("llama_gqa", seed=7), monkeypatch)
    draft = _flash(model_factory("llama_gqa", num_layers=1, seed=107, enable=False), monkeypatch)
    cfg = TriForceConfig(drafter="model", draft_cache_budget=48, **CFG)
    assert_greedy_equal(model, make_prompt(300, seed=6), cfg, 40, assistant_model=draft)


def test_static_steps_refuse_flash_clearly(model_factory, make_prompt, flash3, monkeypatch, forward_counter):
    """The fixed-shape steps need a mask over padded slots, which flash attention cannot take: a clear error,
    before any forward."""
    from hf_triforce.errors import UnsupportedModelError

    model = _flash(model_factory("llama_gqa", seed=7), monkeypatch)
    counter = forward_counter(model)
    with pytest.raises(UnsupportedModelError, match="flash_attention_3"):
        model.generate(make_prompt(200), max_new_tokens=4, triforce_config=TriForceConfig(cuda_graphs="eager", **CFG))
    counter.remove()
    assert counter.calls == 0
