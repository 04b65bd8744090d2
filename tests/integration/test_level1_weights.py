"""``TriForceConfig.level1_weights``: level 1 drafting with an int8 or int4 copy of the weights stays lossless.

The greedy and sampling suites already run with the default (``"auto"``: the int8 copy on these float32 CPU
models); these tests name the choice, check that it is the one run, and that it is refused where it cannot run.
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedDeviceError, UnsupportedModelError
from hf_triforce.hf.linears import int4_weight_copy, int8_weight_copy
from hf_triforce.kernels.int4_linear import Int4Weight, int4_kernel_available
from hf_triforce.kernels.int8_linear import int8_kernel_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not int8_kernel_available(), reason="torch has no _weight_int8pack_mm"),
]

SMALL = dict(chunk_size=8, retrieval_budget=48, recent_window=16, gamma1=2, gamma2=5, adaptive=False)


@pytest.mark.parametrize("family", ["llama_gqa", "qwen3", "mistral"])
@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
@pytest.mark.parametrize("weights", ["int8", "int4", "full"])
def test_greedy_equals_plain_generate(zoo, make_prompt, assert_greedy_equal, family, drafter, weights):
    model = zoo.target(family)
    cfg = TriForceConfig(drafter=drafter, level1_weights=weights, **SMALL)
    assistant = {"assistant_model": zoo.draft(family)} if drafter == "model" else {}
    assert_greedy_equal(model, make_prompt(120, seed=3, repetitive=drafter == "ngram"), cfg, 40, **assistant)
    stats = hf_triforce.last_stats(model)
    assert stats.level1_weights == weights
    assert stats.level1.drafted > 0  # level 1 did draft, with those weights


def test_level1_forwards_run_the_copy_and_level2_does_not(
    llama, make_prompt, monkeypatch, assert_ran, transformers_level1
):
    """The copy serves level 1's forwards only: with 'full' it is never called, with 'int8' it is, and then only
    for level 1's few rows (never the full-cache verification or the prefill); the text is the same. (The model's
    own forward with its layers patched; the direct forward's fused copy: tests/integration/test_direct_forward.py.)"""
    import hf_triforce.hf.linears as linears

    calls: list[int] = []
    real = linears.int8_linear

    def counting(x, weight, bias=None):
        calls.append(x.numel() // x.shape[-1])
        return real(x, weight, bias)

    monkeypatch.setattr(linears, "int8_linear", counting)
    prompt, outputs = make_prompt(120, seed=5), {}
    for weights in ("full", "int8"):
        calls.clear()
        cfg = TriForceConfig(drafter="ngram", level1_weights=weights, **SMALL)
        outputs[weights] = llama.generate(prompt, max_new_tokens=40, do_sample=False, triforce_config=cfg)
        level1 = hf_triforce.last_stats(llama).phases.calls.get("level1", 0)
        assert_ran(llama, rejected=("level1",))
        assert (len(calls) > 0) == (weights == "int8")
        assert len(calls) <= 15 * level1  # 7 linears x 2 layers + lm_head per level-1 forward, at most
    assert max(calls) <= 1 + SMALL["gamma1"]  # level-1 widths only: no verification (gamma2 + 1) or prefill
    assert torch.equal(outputs["full"], outputs["int8"])


def test_batch_greedy_rows_equal_plain_batched_generate(llama, make_prompt, assert_ran):
    prompts = [make_prompt(90, seed=1)[0], make_prompt(70, seed=2)[0]]
    batch = torch.zeros(2, 90, dtype=torch.long)
    mask = torch.zeros(2, 90, dtype=torch.long)
    for b, p in enumerate(prompts):
        batch[b, -p.shape[0] :], mask[b, -p.shape[0] :] = p, 1
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    expected = llama.generate(batch, **kwargs)
    cfg = TriForceConfig(drafter="ngram", level1_weights="int8", **SMALL)
    got = llama.generate(batch, triforce_config=cfg, **kwargs)
    assert torch.equal(expected, got)
    stats = hf_triforce.last_stats(llama)
    assert stats.level1_weights == "int8" and all(row.level1_weights == "int8" for row in stats.rows)
    assert_ran(stats, rejected=("level1",))


def test_copy_covers_the_decoder_and_lm_head(llama):
    copy = int8_weight_copy(llama)
    names = {name for name, module in llama.named_modules() if module in copy}
    assert "lm_head" in names and any(name.endswith("q_proj") for name in names)
    assert int8_weight_copy(llama) is copy  # made once, kept beside the model


def test_disable_frees_the_copy(model_factory, make_prompt, transformers_level1):
    from hf_triforce.hf.linears import _INT8_COPIES

    model = model_factory("llama_gqa")
    cfg = TriForceConfig(**SMALL)  # transformers' forward (the direct forward keeps its own copy)
    model.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=cfg)
    assert model in _INT8_COPIES
    hf_triforce.disable(model)
    assert model not in _INT8_COPIES


def test_explicit_int8_is_refused_before_any_work_where_it_cannot_run(model_factory, make_prompt, monkeypatch):
    model = model_factory("llama_gqa").half()  # float16: the kernel takes bfloat16 or float32 only
    forwards = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: forwards.append(1))
    with pytest.raises(UnsupportedModelError, match="neither float32 nor bfloat16"):
        model.generate(make_prompt(40), max_new_tokens=4, triforce_config=TriForceConfig(level1_weights="int8"))
    assert not forwards


def test_int4_samples_run_to_length_and_use_the_int4_copy(llama, make_prompt, monkeypatch):
    """A sampled call with level 1 on the int4 copy: the copy's kernel runs for level 1's rows only, and the call
    runs to its length (the sampling suite checks the distribution with the default weights)."""
    import hf_triforce.hf.direct_forward as direct_forward
    from hf_triforce.kernels.int4_linear import Int4Weight

    rows: list[int] = []
    real = Int4Weight.rows_product
    monkeypatch.setattr(Int4Weight, "rows_product", lambda w, x: rows.append(x.shape[0]) or real(w, x))
    direct_forward._DECODERS.clear()
    cfg = TriForceConfig(drafter="ngram", level1_weights="int4", **SMALL)
    torch.manual_seed(0)
    out = llama.generate(make_prompt(120, seed=5), max_new_tokens=30, min_new_tokens=30, do_sample=True,
                         temperature=0.8, top_p=0.9, triforce_config=cfg)  # fmt: skip
    assert out.shape[1] == 150 and hf_triforce.last_stats(llama).level1_weights == "int4"
    assert rows and max(rows) <= 1 + SMALL["gamma1"]


def test_auto_falls_back_to_full_weights_where_int8_cannot_run(model_factory, make_prompt):
    model = model_factory("llama_gqa").half()
    cfg = TriForceConfig(drafter="none", **SMALL)
    model.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=cfg)
    assert hf_triforce.last_stats(model).level1_weights == "full"


# ---------------------------------------------------------------------------------------------------------------
# On a CUDA GPU: level 1 on the int4 copy through the tinygemm kernel (issue 55)


@pytest.mark.gpu
@pytest.mark.skipif(not int4_kernel_available("cuda"), reason="needs CUDA int4 (compute capability 8.0+)")
@pytest.mark.parametrize("cuda_graphs", [False, "eager", True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_on_cuda_equals_plain_generate(model_factory, make_prompt, assert_greedy_equal, cuda_graphs, dtype):
    """Greedy TriForce with level 1 on the int4 copy of a CUDA model equals plain ``generate()`` (float32; bfloat16
    within the near-tie rule of the bf16 tests), dynamic, eager fixed-shape and CUDA-graph steps alike, and the copy
    is the one run: int4 projections, the output embeddings their own weights."""
    model = model_factory("llama_gqa").to("cuda", dtype)
    cfg = TriForceConfig(drafter="none", level1_weights="int4", cuda_graphs=cuda_graphs, **SMALL)
    prompt = make_prompt(120, seed=3).cuda()
    if dtype == torch.float32:
        assert_greedy_equal(model, prompt, cfg, 40)
    else:
        model.generate(prompt, max_new_tokens=40, do_sample=False, triforce_config=cfg)
    assert hf_triforce.last_stats(model).level1_weights == "int4"
    copy = int4_weight_copy(model)
    assert copy and all(isinstance(w, Int4Weight) for w in copy.values())
    assert model.get_output_embeddings() not in copy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_auto_is_full_and_int8_is_refused(model_factory, make_prompt):
    model = model_factory("llama_gqa").cuda()
    model.generate(make_prompt(120).cuda(), max_new_tokens=4, triforce_config=TriForceConfig(drafter="none", **SMALL))
    assert hf_triforce.last_stats(model).level1_weights == "full"
    with pytest.raises(UnsupportedDeviceError, match="the int8 kernel runs on the CPU only"):
        model.generate(make_prompt(120).cuda(), max_new_tokens=4, triforce_config=TriForceConfig(level1_weights="int8"))
