"""The call's plan (hf_triforce.generation.plan): what each option resolves to for a given model, device and call,
every refusal from the one capability table with one error type per kind of fault, and the docs' compatibility page
generated from that table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from hf_triforce import TriForceConfig
from hf_triforce.errors import (
    TriForceConfigError,
    TriForceError,
    UnsupportedDeviceError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from hf_triforce.generation import plan
from hf_triforce.generation.plan import FALLBACKS, LIMITS, Call, Facts, compatibility_markdown
from hf_triforce.hf.facts import ModelFacts

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CPU = ModelFacts(unsupported=None, device="cpu", dtype=torch.float32, attention="sdpa", fixed_masks=True, sliding=False,
                 softcap=False, sinks=False, dispatched=False, tensor_parallel=False, dynamic_rope=False,
                 direct_layout=None, int8_kernel=True, int4_kernel=True)  # fmt: skip
CUDA = dataclasses.replace(CPU, device="cuda", dtype=torch.bfloat16)
QUANTIZED = dataclasses.replace(CPU, quantized="its linear layers are quantized with awq (WQLinear)")


def facts(model: ModelFacts = CPU, rows: int = 1, **config) -> Facts:
    ids = torch.zeros(rows, 8, dtype=torch.long)
    call = Call(ids, GenerationConfig(max_length=16), {}, None, [], None, torch.nn.Linear(2, 2))
    return Facts(model, TriForceConfig(**config), call)


@pytest.mark.parametrize(
    "model,setting,expected",
    [
        (CPU, False, "dynamic"),
        (CPU, "auto", "dynamic"),
        (CPU, "eager", "eager"),
        (CUDA, "auto", "graphs"),
        (CUDA, True, "graphs"),
        (dataclasses.replace(CUDA, dynamic_rope=True), "auto", "dynamic"),
        (dataclasses.replace(CUDA, fixed_masks=False), "auto", "dynamic"),
        (dataclasses.replace(CUDA, dispatched=True), "auto", "dynamic"),
    ],
)
def test_steps(model, setting, expected):
    assert plan._steps(facts(model), setting) == expected


@pytest.mark.parametrize(
    "model,setting,fault,message",
    [
        (CPU, True, UnsupportedDeviceError, r"cuda_graphs=True\) cannot run here: the model is on cpu"),
        (dataclasses.replace(CUDA, dynamic_rope=True), True, UnsupportedModelError, "RoPE"),
        (dataclasses.replace(CPU, fixed_masks=False), "eager", UnsupportedModelError, "neither sdpa nor eager"),
        (dataclasses.replace(CPU, dispatched=True), "eager", UnsupportedModelError, "dispatched by accelerate"),
    ],
)
def test_steps_refused(model, setting, fault, message):
    with pytest.raises(fault, match=message):
        plan._steps(facts(model), setting)


@pytest.mark.parametrize(
    "model,choice,direct,expected",
    [
        (CPU, "auto", False, "int8"),
        (CPU, "auto", True, "int4"),
        (CPU, "int4", False, "int4"),
        (CPU, "full", True, "full"),
        (dataclasses.replace(CPU, int4_kernel=False), "auto", True, "int8"),
        (dataclasses.replace(CPU, dtype=torch.float16), "auto", True, "full"),
        (dataclasses.replace(CPU, tensor_parallel=True), "auto", False, "full"),
        (CUDA, "auto", False, "full"),
        (CUDA, "int4", False, "int4"),
        (QUANTIZED, "auto", True, "full"),  # level 1 drafts with the model's own quantized layers
        (QUANTIZED, "full", False, "full"),
    ],
)
def test_level1_weights(model, choice, direct, expected):
    assert plan._weights(facts(model), choice, direct) == expected


@pytest.mark.parametrize(
    "model,choice,fault,message",
    [
        (CUDA, "int8", UnsupportedDeviceError, "the int8 kernel runs on the CPU only"),
        (dataclasses.replace(CPU, dtype=torch.float16), "int8", UnsupportedModelError, "neither float32 nor bfloat16"),
        (dataclasses.replace(CPU, device="meta"), "int8", UnsupportedDeviceError, "CPU only"),
        (dataclasses.replace(CPU, int8_kernel=False), "int8", UnsupportedDeviceError, "_weight_int8pack_mm"),
        (dataclasses.replace(CPU, int8_kernel=False), "int4", UnsupportedDeviceError, "LM head in int8"),
        (dataclasses.replace(CUDA, int4_kernel=False), "int4", UnsupportedDeviceError, "compute capability 8.0"),
        (dataclasses.replace(CPU, dispatched=True), "int4", UnsupportedModelError, "dispatched by accelerate"),
        (QUANTIZED, "int8", UnsupportedModelError, r"with awq \(WQLinear\), and the copy is made from plain float"),
        (dataclasses.replace(QUANTIZED, device="cuda"), "int4", UnsupportedModelError, "with awq"),
    ],
)
def test_level1_weights_refused(model, choice, fault, message):
    with pytest.raises(fault, match=message):
        plan._weights(facts(model), choice, direct=False)


def test_token_trees():
    assert plan._trees(facts(), "auto") and not plan._trees(facts(), 0) and plan._trees(facts(), 8)
    assert not plan._trees(facts(rows=2), "auto")  # 'auto': chains where trees cannot run
    assert plan._trees(facts(dataclasses.replace(CPU, sliding=True)), 8)  # each node's window in its mask
    cases = [
        (facts(rows=2), UnsupportedGenerationError, "a batch verifies chains"),
        (facts(dataclasses.replace(CPU, attention="flash_attention_2")), UnsupportedModelError, "sdpa or eager"),
        (dataclasses.replace(facts(), level1_steps="eager"), TriForceConfigError, "fixed shapes"),
        (facts(dataclasses.replace(CPU, tensor_parallel=True)), UnsupportedModelError, "tensor-parallel"),
    ]
    for f, fault, message in cases:
        with pytest.raises(fault, match=rf"Token trees \(tree_budget=N\) cannot run here: .*{message}"):
            plan._trees(f, 8)


def test_the_direct_forward_is_automatic():
    assert plan.available(facts(), plan._DIRECT)
    assert not plan.available(facts(rows=2), plan._DIRECT)
    assert not plan.available(facts(CUDA), plan._DIRECT)
    assert not plan.available(dataclasses.replace(facts(), level1_steps="eager"), plan._DIRECT)
    assert not plan.available(facts(dataclasses.replace(CPU, direct_layout="a gemma layout")), plan._DIRECT)


def test_a_model_whose_tokens_interact_within_a_forward_is_refused():
    """bitsandbytes' LLM.int8 outlier split makes a verified token's logits depend on the tokens verified with it:
    no call can equal plain decoding, so the model itself is refused (enable() and every call)."""
    interacting = dataclasses.replace(CPU, rows_interact="its 8-bit layers split outlier columns")
    with pytest.raises(UnsupportedModelError, match=r"TriForce on this model cannot run here: .*outlier columns.*"
                       r"llm_int8_threshold=0\.0"):  # fmt: skip
        plan.refuse(facts(interacting), plan._MODEL)
    plan.refuse(facts(QUANTIZED), plan._MODEL)  # quantized alone is served


def test_every_limit_has_one_fault_of_its_kind_and_says_what_to_do():
    kinds = {TriForceConfigError, UnsupportedModelError, UnsupportedDeviceError, UnsupportedGenerationError}
    for limit in LIMITS:
        assert limit.fault in kinds and issubclass(limit.fault, TriForceError)
        assert limit.instead or limit.feature in FALLBACKS, limit  # a refusal says what to do; an automatic choice
        assert limit.instead == "" or limit.instead.endswith("."), limit  # takes another form
    faults = {}
    for limit in LIMITS:  # the same condition never raises two kinds of error for one feature
        faults.setdefault((limit.feature, limit.why), set()).add(limit.fault)
    assert all(len(kinds) == 1 for kinds in faults.values())


def test_compatibility_page_is_the_table():
    page = (ROOT / "docs" / "compatibility.md").read_text()
    begin, end = "<!-- generated by hf_triforce.generation.plan.compatibility_markdown() -->\n", "<!-- end -->"
    generated = page.split(begin, 1)[1].split(end, 1)[0]
    assert generated == compatibility_markdown(), (
        "docs/compatibility.md is stale: regenerate its table with "
        "`python -c 'from hf_triforce.generation.plan import compatibility_markdown as c; print(c())'`"
    )
