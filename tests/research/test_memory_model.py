"""The research bench's memory model (research.memory_peak, research.memory_fit): exact terms, the peak's estimated
terms against measured ones, monotonicity, the fit check (``--prompt-tokens max``)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
from transformers.masking_utils import sdpa_mask

import hf_triforce
from hf_triforce.bench.bandwidth import weight_bytes
from hf_triforce.bench.memory import triforce_kv_bytes, view_bytes
from hf_triforce.config import TriForceConfig
from hf_triforce.errors import TriForceError
from hf_triforce.hf.versions import cache_kwargs, output_cache
from research.memory_fit import (
    H100_BYTES,
    MemoryBudgetError,
    check_fits,
    longest_context,
    required_bytes,
)
from research.memory_peak import (
    GIB,
    draft_cache_bytes,
    logits_bytes,
    plain_generate_estimate,
    prefill_bytes,
    triforce_generate_estimate,
)
from research.shapes import preset_config, random_model

pytestmark = pytest.mark.unit

BF16 = 2
TC = TriForceConfig(retrieval_budget=4096, chunk_size=8, cuda_graphs=False)  # the dynamic view
CONTEXTS = [1024, 4096, 32768, 65536, 120000, 131072, 262144]


def _cfg(name: str):
    return preset_config(name, 131072)


def test_exact_terms_are_the_hand_computations():
    """Llama-2-7B bf16: 13.48 GB of weights, 0.5 MiB of KV a token; Llama-3.1-8B: 128 KiB a token."""
    l7, l8 = _cfg("llama2-7b"), _cfg("llama3.1-8b")
    assert weight_bytes(l7, BF16) == 2 * 6_738_415_616 and weight_bytes(l8, BF16) == 2 * 8_030_261_248
    plain = plain_generate_estimate(l7, 120000, BF16)
    assert plain.weights == 2 * 6_738_415_616
    assert plain.kv == 120000 * 2**19 and round(plain.kv / 1e9, 1) == 62.9
    assert plain_generate_estimate(l8, 131072, BF16).kv == 16 * GIB
    tri = triforce_generate_estimate(l7, 120000, BF16, TC)
    assert tri.kv == (120000 + TC.gamma2 + 2) * 2**19  # reserved up front: max_length + gamma2 + 2, no doubling
    assert tri.summaries == 32 * ((120000 + 8) // 8 + 1) * 32 * 128 * BF16  # layers x chunks x kv heads x head_dim
    one_view = (4096 + TC.refresh_every + TC.gamma2 + TC.gamma1 + 2) * 2**19  # 4110 slots
    dynamic = 4112 * 2**19  # whole chunks of 8
    assert view_bytes(l7, 120000, BF16, TC) == dynamic == tri.view  # one view, re-selected in place
    graphs = triforce_generate_estimate(l7, 120000, BF16, TriForceConfig(cuda_graphs=True))
    assert graphs.view == one_view


@pytest.mark.parametrize("name", ["llama2-7b", "llama3.1-8b"])
@pytest.mark.parametrize("chunk", [None, 8192])
def test_estimates_grow_with_the_context(name, chunk):
    cfg, tc = _cfg(name), TriForceConfig(retrieval_budget=4096, prefill_chunk_size=chunk)
    plain = [plain_generate_estimate(cfg, n, BF16, chunk).total for n in CONTEXTS]
    tri = [triforce_generate_estimate(cfg, n, BF16, tc).total for n in CONTEXTS]
    assert plain == sorted(plain) and tri == sorted(tri)
    assert all(p > weight_bytes(cfg, BF16) for p in plain + tri)


def test_chunked_prefill_lowers_the_estimate_of_a_long_prompt():
    for name in ("llama2-7b", "llama3.1-8b"):
        cfg = _cfg(name)
        whole = triforce_generate_estimate(cfg, 131072, BF16, TC)
        chunked = triforce_generate_estimate(cfg, 131072, BF16, TriForceConfig(prefill_chunk_size=8192))
        assert chunked.prefill < whole.prefill and chunked.total < whole.total
        assert plain_generate_estimate(cfg, 131072, BF16, 8192).total < plain_generate_estimate(cfg, 131072, BF16).total
    # A prompt no longer than the chunk is one unmasked forward either way.
    assert prefill_bytes(_cfg("llama2-7b"), 4096, BF16, 8192) == prefill_bytes(_cfg("llama2-7b"), 4096, BF16)


def test_check_fits_passes_when_small():
    estimate = check_fits(_cfg("llama2-7b"), 32768, BF16, TC, H100_BYTES)
    assert required_bytes(estimate) <= H100_BYTES


def test_check_fits_names_the_shape_the_sizes_and_the_longest_context():
    cfg = _cfg("llama2-7b")
    with pytest.raises(MemoryBudgetError) as caught:
        check_fits(cfg, 131072, BF16, TC, H100_BYTES)
    message = str(caught.value)
    longest = longest_context(cfg, BF16, TC, H100_BYTES)
    assert 0 < longest < 131072 and f"longest context that fits is {longest} tokens" in message
    assert "32 layers, hidden 4096, 32 heads / 32 KV heads x 128, intermediate 11008" in message
    peak = plain_generate_estimate(cfg, 131072, BF16).total / GIB
    assert "79.1 GiB" in message and f"{peak:.1f} GiB" in message  # available; the estimate without the margin
    assert isinstance(caught.value, TriForceError) and isinstance(caught.value, ValueError)


def test_the_message_suggests_a_prefill_chunk_size_when_the_prefill_overflows():
    cfg, available = _cfg("llama3.1-8b"), 40 * GIB
    with pytest.raises(MemoryBudgetError, match=r"--prefill-chunk-size 4096 makes it fit"):
        check_fits(cfg, 131072, BF16, TC, available)
    chunked = TriForceConfig(retrieval_budget=4096, prefill_chunk_size=4096)
    check_fits(cfg, 131072, BF16, chunked, available, plain_prefill_chunk=4096)


def test_no_prefill_hint_when_decoding_sets_the_peak():
    cfg, chunked = _cfg("llama2-7b"), TriForceConfig(retrieval_budget=8192, prefill_chunk_size=8192, cuda_graphs=False)
    assert not triforce_generate_estimate(cfg, 120000, BF16, chunked).prefill_bound  # and it is the larger estimate
    with pytest.raises(MemoryBudgetError) as caught:
        check_fits(cfg, 120000, BF16, chunked, H100_BYTES, plain_prefill_chunk=8192)
    assert "--prefill-chunk-size" not in str(caught.value)


def test_nothing_fits():
    assert longest_context(_cfg("llama2-7b"), BF16, TC, 12 * GIB) == 0
    with pytest.raises(MemoryBudgetError, match="No context fits"):
        check_fits(_cfg("llama2-7b"), 4096, BF16, TC, 12 * GIB)


@pytest.mark.parametrize(
    ("name", "chunk", "available", "multiple"),
    [
        ("llama2-7b", None, H100_BYTES, 1024),
        ("llama2-7b", 8192, H100_BYTES, 1024),
        ("llama3.1-8b", None, H100_BYTES, 1024),
        ("llama3.1-8b", 4096, 40 * GIB, 1000),
        ("tiny", None, GIB + 10**6, 64),
    ],
)
def test_longest_context_is_the_fit_boundary(name, chunk, available, multiple):
    cfg, tc = _cfg(name), TriForceConfig(retrieval_budget=64, chunk_size=8, recent_window=16, prefill_chunk_size=chunk)
    n = longest_context(cfg, BF16, tc, available, multiple, plain_prefill_chunk=chunk)
    assert n > 0 and n % multiple == 0
    check_fits(cfg, n, BF16, tc, available, plain_prefill_chunk=chunk)
    with pytest.raises(MemoryBudgetError):
        check_fits(cfg, n + multiple, BF16, tc, available, plain_prefill_chunk=chunk)


def test_a_draft_model_adds_its_weights_and_cache():
    cfg, draft = _cfg("llama3.1-8b"), _cfg("draft-68m")
    alone = triforce_generate_estimate(cfg, 65536, BF16, TC)
    with_draft = triforce_generate_estimate(cfg, 65536, BF16, TC, draft)
    resized = weight_bytes(draft, BF16) + (128256 - 32000) * 768 * 2 * BF16  # embeddings resized to the target's
    assert with_draft.draft > resized + draft_cache_bytes(draft, BF16, TC)
    assert with_draft.total == alone.total + with_draft.draft


def test_the_transformers_facts_the_model_relies_on():
    """No mask for a one-forward prefill or a decoding step; a [1, 1, q, kv] one for a chunk after cached tokens;
    GQA with a mask goes through repeat_kv; DynamicLayer.update reallocates (torch.cat)."""
    assert sdpa_mask(batch_size=1, q_length=4096, kv_length=4096) is None
    assert sdpa_mask(batch_size=1, q_length=1, kv_length=4096, q_offset=4095) is None
    chunk_mask = sdpa_mask(batch_size=1, q_length=8, kv_length=40, q_offset=32)
    assert chunk_mask.shape == (1, 1, 8, 40) and chunk_mask.dtype == torch.bool
    keys = torch.zeros(1, 2, 40, 16)
    assert use_gqa_in_sdpa(None, keys, keys) and not use_gqa_in_sdpa(chunk_mask, keys, keys)
    layer = DynamicLayer()
    layer.update(keys, keys)
    before = layer.keys.data_ptr()
    layer.update(keys[:, :, :1], keys[:, :, :1])
    assert layer.keys.data_ptr() != before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_terms_equal_the_caches_of_real_generate_calls(dtype):
    """Tiny random models on the CPU: the estimate's cache terms are the allocated bytes, exactly."""
    prompt, new = 200, 6  # (200 - recent_window) % chunk_size == 0: the first selection fills the budget
    model = random_model("tiny", context=512, dtype=dtype, device="cpu")
    draft = random_model("tiny", context=512, dtype=dtype, device="cpu", seed=1)
    size = dtype.itemsize
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    out = model.generate(ids, return_dict_in_generate=True, **kwargs)
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in output_cache(out).layers)
    assert plain_generate_estimate(model.config, prompt + new - 1, size).kv == cached  # the last token is not fed

    tc = TriForceConfig(
        retrieval_budget=64, chunk_size=8, recent_window=16, drafter="model", draft_cache_budget=48, cuda_graphs=False
    )  # what 'auto' runs on the CPU; on CUDA the model counts the fixed view
    hf_triforce.enable(model)
    model.generate(ids, triforce_config=tc, assistant_model=draft, **kwargs)
    stats = hf_triforce.last_stats(model)
    assert stats.full_cache_bytes == triforce_kv_bytes(model.config, prompt + new, size, tc)
    assert stats.view_bytes == view_bytes(model.config, prompt + new, size, tc)
    assert stats.draft_cache_bytes == draft_cache_bytes(draft.config, size, tc)


class LiveBytes(TorchDispatchMode):
    """Tracks the bytes of tensor storage created inside the mode and still alive; ``peak`` is their maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int, size: int) -> None:
        self.current -= size
        self.live.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
            if storage is None or storage.nbytes() == 0 or storage.data_ptr() in self.live:
                continue
            key, size = storage.data_ptr(), storage.nbytes()
            self.live[key], self.current = size, self.current + size
            weakref.finalize(storage, self._free, key, size)
            self.peak = max(self.peak, self.current)
        return out


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_one_forward_prefill_estimate_bounds_the_measured_activations(kv_heads):
    """bf16 on the CPU: the live tensors of a one-forward prefill peak at the estimate's MLP phase, to the byte
    (the estimate's only slack is its logits term)."""
    prompt = 1024
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=kv_heads, vocab_size=1000, max_position_embeddings=prompt)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, prompt))
    tracker = LiveBytes()
    with torch.inference_mode(), tracker:
        model(ids, **cache_kwargs(DynamicCache(config=cfg)), use_cache=True, logits_to_keep=1)
    measured = tracker.peak - plain_generate_estimate(cfg, prompt, BF16).kv  # the cache it wrote is not transient
    estimate = prefill_bytes(cfg, prompt, BF16)
    assert 0 <= estimate - measured <= logits_bytes(cfg, 1, BF16)


@pytest.fixture
def gpu_with_free(monkeypatch):
    """``gpu_with_free(bytes)``: the benchmark sees a CUDA device with that much free memory (nothing is loaded)."""

    def set_(free: int) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, free))

    return set_


def _bench_options(**kw):
    from research.lab_bench import LabOptions

    base = dict(preset="llama2-7b", device="cuda", dtype="bfloat16", temperatures=[0.0], budgets=[4096],
                drafters=["none"], new_tokens=128)  # fmt: skip
    return LabOptions(**{**base, **kw})


def test_bench_resolves_max_to_the_longest_prompt_that_fits(gpu_with_free):
    from research.lab_bench import _checked_prompt_lengths

    gpu_with_free(H100_BYTES)
    lengths = _checked_prompt_lengths(_bench_options(prompt_tokens=[32768, "max"]))
    tc = TriForceConfig(retrieval_budget=4096, drafter="none")
    assert lengths == [32768, longest_context(preset_config("llama2-7b", 1), 2, tc, H100_BYTES) - 128]


def test_bench_refuses_a_prompt_that_does_not_fit_before_loading_anything(gpu_with_free):
    from research.lab_bench import LabOptions, run_lab

    gpu_with_free(40 * GIB)
    with pytest.raises(MemoryBudgetError, match="The longest context that fits is"):
        run_lab(_bench_options(prompt_tokens=[120000]))  # would build a 7B model on "cuda" otherwise
    with pytest.raises(ValueError, match="needs --preset and --device cuda"):
        run_lab(LabOptions(preset="tiny", prompt_tokens=["max"]))


def test_a_static_view_kept_from_an_earlier_call_counts_in_the_plain_run():
    from research.memory_fit import _estimates

    cfg = preset_config("llama3.1-8b", 1)
    dynamic = TriForceConfig(retrieval_budget=4096, cuda_graphs=False)
    static = TriForceConfig(retrieval_budget=4096, cuda_graphs=True)
    plain_dynamic = _estimates(cfg, 65536, 2, dynamic, None, None)[0]
    plain_static = _estimates(cfg, 65536, 2, static, None, None)[0]
    assert plain_dynamic.kept_view == 0
    assert plain_static.total - plain_dynamic.total == plain_static.kept_view == view_bytes(cfg, 65536, 2, static)
