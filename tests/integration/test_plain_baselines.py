"""The bench's plain baselines on a tiny Llama: each configuration decodes what plain ``generate()`` does, from a
copy of the prompt's one prefill, and one that cannot run or fails is reported, not dropped."""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce.bench.comparison import compare
from hf_triforce.bench.options import DEFAULT_PLAIN
from hf_triforce.bench.plain_baselines import measure_plain_decodings
from hf_triforce.bench.plain_decoding import PlainDecoding, generate_batch_one, prefilled_cache
from hf_triforce.bench.prefix import STATIC_ROUNDING, Prefix
from hf_triforce.hf.versions import cache_kwargs

pytestmark = pytest.mark.integration

GREEDY = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def prompt(make_prompt):
    return make_prompt(300, seed=4)


@pytest.fixture(scope="module")
def plain(llama, prompt):
    with torch.inference_mode():
        return llama.generate(prompt, **GREEDY)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_generate_from_a_prefilled_cache_equals_a_fresh_call(llama, prompt, plain, kind):
    cache = prefilled_cache(llama, prompt[:, :-1], kind, max_cache_len=512, chunk_size=128)  # three chunks
    assert cache.get_seq_length() == prompt.shape[1] - 1
    with torch.inference_mode():
        out = llama.generate(prompt, **cache_kwargs(cache), **GREEDY, disable_compile=True)
    assert torch.equal(out, plain)


def test_each_plain_decoding_from_the_prefix_decodes_plain_generates_text(llama, prompt, plain):
    prefix = Prefix(llama, prompt, GREEDY["max_new_tokens"])
    runs = measure_plain_decodings(llama, prompt, ["static", "flash_attention_2", "continuous_batching"], prefix,
                                   **GREEDY)  # fmt: skip
    assert torch.equal(runs["static"].sequences, plain) and runs["static"].new_tokens == 12
    assert runs["flash_attention_2"].startswith("not run: flash_attention_2 is measured on CUDA only")
    assert runs["continuous_batching"].startswith("not run:")
    assert set(prefix.prefill_seconds) == {"static"}  # prefilled once, for the one static configuration
    assert prefix.copy("static").layers[0].max_cache_len == STATIC_ROUNDING  # 300 + 12 tokens rounded up


def test_a_configuration_that_fails_is_reported(llama, prompt, monkeypatch):
    def broken(self, model, cache):
        return {"cache_implementation": "no-such-cache"}

    monkeypatch.setattr(PlainDecoding, "generate_kwargs", broken)
    runs = measure_plain_decodings(llama, prompt, ["static"], **GREEDY)
    assert runs["static"].startswith("failed: ValueError"), runs


def test_generate_batch_with_one_request_equals_generate(llama, prompt, plain):
    sequences, stamps = generate_batch_one(llama, prompt, **GREEDY)
    assert torch.equal(sequences, plain) and len(stamps) == 12 and stamps == sorted(stamps)


def test_compare_from_a_prefix_keeps_triforce_lossless_and_names_best_plain(llama, prompt, plain):
    config = hf_triforce.TriForceConfig(retrieval_budget=128, chunk_size=8, adaptive=False)
    prefix = Prefix(llama, prompt, GREEDY["max_new_tokens"])
    result = compare(llama, prompt, config, prefix=prefix, plain_decodings=("dynamic", "static"), **GREEDY)
    assert torch.equal(result.triforce.sequences, plain) and torch.equal(result.plain.sequences, plain)
    assert result.plain_decodings["dynamic"] is result.plain and torch.equal(
        result.plain_decodings["static"].sequences, plain
    )
    fastest = min(result.plain_decodings.values(), key=lambda run: run.decode_seconds_per_token)
    assert result.best_plain_run is fastest
    assert result.speedup_best_plain == pytest.approx(
        fastest.decode_seconds_per_token / result.triforce.decode_seconds_per_token
    )
    row = result.to_dict()
    assert row["plain_decodings"]["static"]["identical_to_default"] is True and row["best_plain"] in (
        "dynamic",
        "static",
    )
    assert set(DEFAULT_PLAIN) >= set(row["plain_decodings"])
