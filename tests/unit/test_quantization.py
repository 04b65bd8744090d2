"""What a quantized model is (hf_triforce.hf.quantization), read off stand-ins of each integration's layers, so it is
checked without bitsandbytes, AWQ or GPTQ installed: which linears carry no plain float weight, and whether a token's
logits depend on the other tokens of a forward; and what the plan then does (tests/integration/test_quantized.py runs
the real packages that install on a CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedModelError
from hf_triforce.generation import plan
from hf_triforce.generation.plan import Facts, check_model
from hf_triforce.hf.facts import model_facts
from hf_triforce.hf.linears import _plain_layers
from hf_triforce.hf.quantization import is_plain_linear, quantization_method, quantized_linears, rows_interact

pytestmark = pytest.mark.unit


class WQLinear(torch.nn.Module):
    """Stands for AWQ's ``WQLinear_GEMM`` / GPTQ's ``QuantLinear``: not an ``nn.Linear``, packed weights, no
    ``.weight``."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", linear.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.qweight.t()


class Linear8bitLt(torch.nn.Linear):
    """Stands for bitsandbytes' ``Linear8bitLt``: an ``nn.Linear`` subclass whose matmul state has an outlier
    threshold."""

    def __init__(self, linear: torch.nn.Linear, threshold: float) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.load_state_dict(linear.state_dict())
        self.state = SimpleNamespace(threshold=threshold)


class Int8Tensor(torch.Tensor):
    """Stands for torchao's weight tensor subclasses (the layer stays a plain ``nn.Linear``)."""


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def replace_q_proj(model: LlamaForCausalLM, make) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_proj = make(layer.self_attn.q_proj)


def test_a_float_model_is_not_quantized():
    model = tiny_llama()
    facts = model_facts(model)
    assert facts.quantized is None and facts.rows_interact is None and facts.direct_layout is None
    assert quantization_method(model) is None
    assert all(is_plain_linear(m) for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_layers_that_are_not_linear_subclasses_are_found():
    model = tiny_llama()
    replace_q_proj(model, WQLinear)
    model.config.quantization_config = {"quant_method": "awq"}
    facts = model_facts(model)
    assert facts.quantized == "its linear layers are quantized with awq (WQLinear)"
    assert "quantized with awq" in facts.direct_layout  # the direct forward reads .weight: transformers' runs level 1
    assert facts.rows_interact is None
    f = Facts(facts, TriForceConfig(), None)
    assert plan._weights(f, "auto", direct=False) == "full"  # no int8/int4 copy of quantized layers
    refused = r"level1_weights='int4' cannot run here: .* with awq \(WQLinear\), and the copy is made from plain float"
    with pytest.raises(UnsupportedModelError, match=refused):
        plan._weights(f, "int4", direct=False)


def test_a_weight_tensor_subclass_is_quantized_and_left_alone():
    model = tiny_llama()
    q_proj = model.model.layers[0].self_attn.q_proj
    q_proj.weight = torch.nn.Parameter(q_proj.weight.detach().as_subclass(Int8Tensor), requires_grad=False)
    assert type(q_proj) is torch.nn.Linear and not is_plain_linear(q_proj)
    assert quantized_linears(model) == "its linear layers are quantized (Int8Tensor)"
    assert q_proj not in _plain_layers(model)  # the few-row path and the int8/int4 copies never touch it
    assert model.model.layers[1].self_attn.q_proj in _plain_layers(model)


def test_an_outlier_threshold_makes_tokens_interact_and_the_model_is_refused():
    model = tiny_llama()
    replace_q_proj(model, lambda linear: Linear8bitLt(linear, threshold=6.0))
    assert "llm_int8_threshold=6" in rows_interact(model)
    with pytest.raises(UnsupportedModelError, match="outlier columns.*llm_int8_threshold=0.0"):
        check_model(model)


def test_no_outlier_threshold_is_served():
    model = tiny_llama()
    replace_q_proj(model, lambda linear: Linear8bitLt(linear, threshold=0.0))
    assert rows_interact(model) is None
    assert quantized_linears(model) == "its linear layers are quantized (Linear8bitLt)"
    check_model(model)
