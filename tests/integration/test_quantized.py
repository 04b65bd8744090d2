"""Quantized targets, loaded as users load them (``from_pretrained(..., quantization_config=...)`` of a saved tiny
Llama): greedy output equal to plain ``generate()`` on the same quantized model, level 1 drafting with the model's own
quantized layers through transformers' forward; what cannot serve them is refused with the reason.

Runs what installs on a CPU: optimum-quanto (int8, int4 weights), bitsandbytes (4-bit; 8-bit without the outlier
split, and its refusal with it) and torchao (int8 weight-only); each case skips when its package is missing. AWQ and
GPTQ need GPU kernels: their layers are checked from stand-ins in tests/unit/test_quantization.py.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedModelError
from hf_triforce.hf.facts import model_facts
from tests.integration.conftest import build_model
from tests.support.speculation import Ran

pytestmark = pytest.mark.integration

SMALL = dict(chunk_size=8, retrieval_budget=48, recent_window=16, gamma1=2, gamma2=5, adaptive=False)
WHOLE = dict(chunk_size=8, retrieval_budget=512, recent_window=16, gamma1=2, gamma2=5, adaptive=False)
PROMPT = 400


def _installed(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


def _quanto(weights: str):
    from transformers import QuantoConfig

    return QuantoConfig(weights=weights)


def _bnb(**kwargs):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**kwargs)


def _torchao_int8():
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    return TorchAoConfig(Int8WeightOnlyConfig())


QUANTO, BNB, TORCHAO = _installed("optimum.quanto"), _installed("bitsandbytes"), _installed("torchao")
SERVED = {
    "quanto-int8": (lambda: _quanto("int8"), QUANTO, "QLinear"),
    "quanto-int4": (lambda: _quanto("int4"), QUANTO, "QLinear"),
    "bnb-4bit": (lambda: _bnb(load_in_4bit=True), BNB, "Linear4bit"),
    "bnb-8bit-no-outliers": (lambda: _bnb(load_in_8bit=True, llm_int8_threshold=0.0), BNB, "Linear8bitLt"),
    "torchao-int8-weight-only": (_torchao_int8, TORCHAO, "Int8Tensor"),
}


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory) -> Path:
    """A tiny random Llama (GQA, float32) saved once, to load quantized as a user would."""
    path = tmp_path_factory.mktemp("tiny-llama")
    build_model("llama_gqa", enable=False).save_pretrained(path)
    return path


def load_quantized(path: Path, quantization_config) -> torch.nn.Module:
    with warnings.catch_warnings():  # bitsandbytes warns that it casts float32 inputs to float16
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(
            path, quantization_config=quantization_config, attn_implementation="sdpa", dtype=torch.float32,
            device_map="cpu",
        )  # fmt: skip
    return model.eval()


@pytest.fixture(scope="module", params=[pytest.param(k, marks=v[1]) for k, v in SERVED.items()])
def quantized(request, saved_llama) -> tuple[str, torch.nn.Module]:
    make, _, layer = SERVED[request.param]
    model = load_quantized(saved_llama, make())
    hf_triforce.enable(model)
    return layer, model


@pytest.mark.parametrize("drafter", ["none", "ngram"])
@pytest.mark.parametrize("budget", ["small", "whole"])
def test_greedy_equals_plain_generate_on_the_quantized_model(quantized, make_prompt, assert_greedy_equal, drafter,
                                                             budget):  # fmt: skip
    layer, model = quantized
    assert layer in model_facts(model).quantized
    config = TriForceConfig(drafter=drafter, **(SMALL if budget == "small" else WHOLE))
    ran = Ran(rejected=("level1",)) if budget == "small" else Ran(accepted=("level1",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_greedy_equal(model, make_prompt(PROMPT, seed=3, repetitive=drafter == "ngram"), config, 40, ran=ran)
    stats = hf_triforce.last_stats(model)
    assert (stats.level1_forward, stats.level1_weights) == ("transformers", "full")  # its own quantized layers


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_low_bit_copy_of_quantized_layers_is_refused(quantized, make_prompt, weights):
    layer, model = quantized
    config = TriForceConfig(level1_weights=weights, **SMALL)
    refused = rf"level1_weights='{weights}' cannot run here: its linear layers are quantized with .*{layer}.*float"
    with pytest.raises(UnsupportedModelError, match=refused):
        model.generate(make_prompt(PROMPT, seed=3), max_new_tokens=4, do_sample=False, triforce_config=config)


@BNB
def test_bitsandbytes_8bit_with_the_outlier_split_is_refused(saved_llama):
    """LLM.int8's default threshold (6.0) picks outlier columns over all the tokens of a forward: a token's logits
    depend on the tokens verified with it, so no verification can give plain decoding's tokens."""
    model = load_quantized(saved_llama, _bnb(load_in_8bit=True))
    layer = model.model.layers[0].self_attn.q_proj
    x = torch.randn(1, 6, layer.in_features, generator=torch.Generator().manual_seed(0)) * 3  # some |x| > 6
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone, together = layer(x[:, 5:]), layer(x)[:, 5:]
    assert not torch.equal(alone, together)  # why it is refused: the last token's output changed with the others
    with pytest.raises(
        UnsupportedModelError, match=r"outlier columns \(llm_int8_threshold=6\).*llm_int8_threshold=0\.0"
    ):
        hf_triforce.enable(model)
