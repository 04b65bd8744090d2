"""``TriForceConfig.level1_weights``: level 1 drafting with an int8 or int4 copy of the weights stays lossless.

The greedy and sampling suites already run with the default (``"auto"``: the int8 copy on these float32 CPU
models); these tests name the choice, check that it is the one run, and that it is refused where it cannot run.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import hf_triforce
import hf_triforce.generation.call
import hf_triforce.hierarchy.level1
from hf_triforce import TriForceConfig
from hf_triforce.errors import UnsupportedDeviceError, UnsupportedGenerationError
from hf_triforce.hf.linears import int4_weight_copy, int8_weight_copy, resolve_level1_weights
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.kernels.int4_linear import Int4Weight, int4_kernel_available
from hf_triforce.kernels.int8_linear import int8_kernel_available

# TriForceConfig fields deprecated in 0.2 (removed in 0.3) that these tests still exercise
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not int8_kernel_available(), reason="torch has no _weight_int8pack_mm"),
    pytest.mark.filterwarnings("ignore:level1_forward:FutureWarning"),
    pytest.mark.filterwarnings("ignore:step_selection:FutureWarning"),
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


def test_level1_forwards_run_the_copy_and_level2_does_not(llama, make_prompt, monkeypatch, assert_ran):
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
        cfg = TriForceConfig(drafter="ngram", level1_weights=weights, level1_forward="transformers", **SMALL)
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


def test_disable_frees_the_copy(model_factory, make_prompt):
    from hf_triforce.hf.linears import _INT8_COPIES

    model = model_factory("llama_gqa")
    cfg = TriForceConfig(level1_forward="transformers", **SMALL)  # the direct forward keeps its own copy
    model.generate(make_prompt(60), max_new_tokens=8, do_sample=False, triforce_config=cfg)
    assert model in _INT8_COPIES
    hf_triforce.disable(model)
    assert model not in _INT8_COPIES


def test_explicit_int8_is_refused_before_any_work_where_it_cannot_run(model_factory, make_prompt, monkeypatch):
    model = model_factory("llama_gqa").half()  # float16: the kernel takes bfloat16 or float32 only
    forwards = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: forwards.append(1))
    with pytest.raises(UnsupportedDeviceError, match="float16"):
        model.generate(make_prompt(40), max_new_tokens=4, triforce_config=TriForceConfig(level1_weights="int8"))
    assert not forwards


def test_int4_samples_run_to_length_and_use_the_int4_copy(llama, make_prompt, monkeypatch):
    """A sampled call with level 1 on the int4 copy: the copy's kernel runs for level 1's rows only, and the call
    runs to its length (the sampling suite checks the distribution with the default weights)."""
    import hf_triforce.hf.direct_forward as direct_forward

    rows: list[int] = []
    real = direct_forward.int4_linear
    monkeypatch.setattr(
        direct_forward, "int4_linear", lambda x, w, b=None: rows.append(x.numel() // x.shape[-1]) or real(x, w, b)
    )
    direct_forward._DECODERS.clear()
    cfg = TriForceConfig(drafter="ngram", level1_weights="int4", **SMALL)
    torch.manual_seed(0)
    out = llama.generate(make_prompt(120, seed=5), max_new_tokens=30, min_new_tokens=30, do_sample=True,
                         temperature=0.8, top_p=0.9, triforce_config=cfg)  # fmt: skip
    assert out.shape[1] == 150 and hf_triforce.last_stats(llama).level1_weights == "int4"
    assert rows and max(rows) <= 1 + SMALL["gamma1"]


@pytest.mark.parametrize(
    "config, batch, error",
    [
        ({"level1_forward": "transformers"}, False, UnsupportedDeviceError),
        ({"cuda_graphs": "eager"}, False, UnsupportedDeviceError),  # static steps run transformers' forward
        ({}, True, UnsupportedGenerationError),  # batches run transformers' forward
    ],
    ids=["transformers-forward", "static-steps", "batch"],
)
@pytest.mark.parametrize("option, match", [({"step_selection": True}, "step_selection")], ids=["step-selection"])
def test_direct_forward_options_are_refused_before_any_work_where_the_direct_forward_does_not_run(
    llama, make_prompt, config, batch, error, option, match
):
    """Per-step re-selection needs level 1's direct forward (tests/integration/test_step_selection.py covers the rest
    of step_selection). int4 weights run on either forward (test_batch_options.py)."""
    prompt = make_prompt(40).repeat(2 if batch else 1, 1)
    cfg = TriForceConfig(**option, **config, **SMALL)
    calls = []
    handle = llama.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match=match):
            llama.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, triforce_config=cfg)
    finally:
        handle.remove()
    assert not calls


@pytest.mark.parametrize(
    "option, match",
    [
        ({"level1_forward": "direct"}, "resolved to 'graphs'"),
        ({"step_selection": True}, "step_selection"),
    ],
    ids=["direct-forward", "step-selection"],
)
def test_graphs_chosen_by_auto_refuse_direct_forward_options_before_the_callers_cache_is_taken(
    llama, make_prompt, monkeypatch, option, match
):
    """``cuda_graphs='auto'`` resolves to CUDA graphs on a GPU, where level 1 runs transformers' forward: an option
    that needs the direct forward is refused by the call's first checks, before the full cache is built from the
    caller's (here the planned step mode stands in for the GPU's, so the check runs on the CPU)."""
    planned = hf_triforce.hierarchy.level1.planned_step_mode
    monkeypatch.setattr(
        hf_triforce.hierarchy.level1,
        "planned_step_mode",
        lambda setting, model: "graphs" if setting == "auto" else planned(setting, model),
    )
    built = []  # the full cache the call starts from: a copy of the caller's KV, the work the checks must precede
    start = hf_triforce.generation.call.start_cache
    monkeypatch.setattr(hf_triforce.generation.call, "start_cache", lambda *a: built.append(1) or start(*a))
    prompt = make_prompt(40)
    cache = DynamicCache(config=llama.config)
    with torch.no_grad():
        llama(input_ids=prompt[:, :30], use_cache=True, **cache_kwargs(cache))
    calls = []
    handle = llama.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(UnsupportedDeviceError, match=match):
            llama.generate(prompt, max_new_tokens=4, do_sample=False, triforce_config=TriForceConfig(
                cuda_graphs="auto", **option, **SMALL), **cache_kwargs(cache))  # fmt: skip
    finally:
        handle.remove()
    assert not built and not calls and cache.get_seq_length() == 30


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
    assert resolve_level1_weights("auto", model) == "full"
    with pytest.raises(UnsupportedDeviceError, match="int8 kernel is CPU-only"):
        model.generate(make_prompt(120).cuda(), max_new_tokens=4, triforce_config=TriForceConfig(level1_weights="int8"))
