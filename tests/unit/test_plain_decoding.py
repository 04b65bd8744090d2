"""The plain decoding configurations: what each passes to generate(), and what cannot run here says why."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from hf_triforce.bench.plain_baselines import best_plain
from hf_triforce.bench.plain_decoding import (
    PLAIN_DECODINGS,
    PlainDecodingUnavailable,
    compile_config,
    plain_decoding,
)
from hf_triforce.bench.timed_run import RunResult
from hf_triforce.hf.versions import CACHE_ARG

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_static_switches_compilation_off_and_compiled_forces_it_on_the_cpu(model):
    assert plain_decoding("dynamic").generate_kwargs(model, None) == {}
    assert plain_decoding("static").generate_kwargs(model, None) == {
        "cache_implementation": "static", "disable_compile": True,
    }  # fmt: skip
    compiled = plain_decoding("static_compiled").generate_kwargs(model, None)
    assert compiled["cache_implementation"] == "static" and "disable_compile" not in compiled
    assert compiled["compile_config"]._compile_all_devices is True and compiled["compile_config"].mode == "default"
    assert compile_config(torch.device("cuda")).mode == "reduce-overhead"  # transformers' default on a GPU


def test_a_prefilled_cache_replaces_cache_implementation(model):
    cache = DynamicCache()
    kwargs = plain_decoding("static").generate_kwargs(model, cache)
    assert kwargs == {CACHE_ARG: cache, "disable_compile": True}


def test_cuda_only_configurations_say_so_on_the_cpu(model):
    for decoding in PLAIN_DECODINGS:
        if decoding.cuda_only:
            with pytest.raises(PlainDecodingUnavailable, match="CUDA only"):
                decoding.check(model)
        else:
            decoding.check(model)
    with pytest.raises(ValueError, match="choose from .*'static_compiled'"):
        plain_decoding("vllm")


def test_best_plain_is_the_fastest_that_ran():
    def run(seconds):
        return RunResult(torch.zeros(1, 2, dtype=torch.long), 1, 0.0, seconds)

    runs = {"dynamic": run(0.2), "static": run(0.1), "flash_attention_2": "not run: CUDA only"}
    assert best_plain(runs) == "static"
    with pytest.raises(ValueError, match="no plain decoding ran"):
        best_plain({"flash_attention_2": "not run: CUDA only"})
