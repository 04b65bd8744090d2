"""The caches' memory terms of ``hf-triforce estimate`` (hf_triforce.bench.memory), each exact: the allocated bytes of
real ``generate()`` calls' caches."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_triforce
from hf_triforce.bench.bandwidth import attended_kv_bytes, kv_bytes_per_token
from hf_triforce.bench.memory import summaries_bytes, triforce_kv_bytes, view_bytes
from hf_triforce.caches import RetrievalCache
from hf_triforce.config import TriForceConfig
from hf_triforce.hf.versions import output_cache

pytestmark = pytest.mark.unit

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)  # fmt: skip


def test_exact_terms_are_the_hand_computations():
    """Llama-2-7B (LlamaConfig's defaults) at 120K tokens in bf16: 0.5 MiB of KV a token."""
    l7, tc = LlamaConfig(), TriForceConfig(retrieval_budget=4096, chunk_size=8)
    assert kv_bytes_per_token(l7, 2) == 2**19
    assert triforce_kv_bytes(l7, 120000, 2, tc) == (120000 + tc.gamma2 + 2) * 2**19  # max_length + gamma2 + 2
    assert summaries_bytes(l7, 120000, 2, tc) == 32 * ((120000 + 8) // 8 + 1) * 32 * 128 * 2  # layers x chunks x ...
    one_view = (4096 + tc.refresh_every + tc.gamma2 + tc.gamma1 + 2) * 2**19  # 4110 slots
    assert view_bytes(l7, 120000, 2, tc) == one_view  # cuda_graphs="auto" on a GPU: the fixed view
    dynamic = TriForceConfig(retrieval_budget=4096, chunk_size=8, cuda_graphs=False)
    assert view_bytes(l7, 120000, 2, dynamic) == 4112 * 2**19  # whole chunks of 8, re-selected in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_terms_equal_the_caches_of_real_generate_calls(dtype):
    """Tiny random models on the CPU: the estimate's cache terms are the allocated bytes, exactly."""
    prompt, new = 200, 6  # (200 - recent_window) % chunk_size == 0: the first selection fills the budget
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).to(dtype).eval()
    size = dtype.itemsize
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    out = model.generate(ids, return_dict_in_generate=True, **kwargs)
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in output_cache(out).layers)
    assert attended_kv_bytes(model.config, prompt + new - 1, size) == cached  # the last token is not fed

    tc = TriForceConfig(retrieval_budget=64, chunk_size=8, recent_window=16, drafter="ngram", cuda_graphs=False)
    hf_triforce.enable(model)  # cuda_graphs=False: what "auto" runs on the CPU (on CUDA the fixed view)
    model.generate(ids, triforce_config=tc, **kwargs)
    stats = hf_triforce.last_stats(model)
    assert stats.full_cache_bytes == triforce_kv_bytes(model.config, prompt + new, size, tc)
    assert stats.view_bytes == view_bytes(model.config, prompt + new, size, tc)


def test_summaries_term_equals_the_retrieval_cache_allocation():
    cfg, tc, context = LlamaConfig(**TINY), TriForceConfig(retrieval_budget=64, recent_window=16), 300
    capacity = tc.full_cache_capacity(context)  # what the generation loop reserves
    cache = RetrievalCache(cfg.num_hidden_layers, tc.chunk_size, capacity)
    for i in range(cfg.num_hidden_layers):
        states = torch.randn(1, cfg.num_key_value_heads, 200, cfg.hidden_size // cfg.num_attention_heads)
        cache.update(states, states, layer_idx=i)
        cache.layers[i].summaries()
    allocated = cache.summaries.shared.nbytes  # the storage (every layer side by side), not the filled part
    assert allocated == summaries_bytes(cfg, context, 4, tc)
