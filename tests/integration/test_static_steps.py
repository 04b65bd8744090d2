"""Static-shape decoding steps (``cuda_graphs``) end to end on the CPU, in their eager form (``cuda_graphs="eager"``).

The eager static steps are the CPU reference of the CUDA-graph path: the same forwards over the same
fixed-capacity buffers, without capture. Checked here: greedy TriForce output equals plain ``generate()``
token for token with the static path forced on (no drafter, n-gram, a level-0 draft model with an evicting
StreamingLLM cache, full acceptance, eager attention, Qwen2), the static path is really taken, it drafts
exactly what the dynamic-shape path drafts with the same forward (transformers', as on a GPU; equal per-level
acceptance counts), the level-0 static draft
cache gives the dynamic one's logits across evictions and restarts, and the ``cuda_graphs`` setting is
validated and resolved before any forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.streaming import StreamingLLMCache
from hf_triforce.errors import TriForceConfigError, TriForceError, UnsupportedDeviceError
from hf_triforce.generation import plan
from hf_triforce.generation.plan import Facts
from hf_triforce.generation.state import state_of
from hf_triforce.hf.facts import model_facts
from hf_triforce.hf.model import layer_rotary
from hf_triforce.hierarchy import ModelDrafter, static_steps
from tests.support.speculation import Ran

pytestmark = pytest.mark.integration

SMALL = dict(
    chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False
)  # same drafts on both paths


def _levels(model) -> dict:
    return hf_triforce.last_stats(model).to_dict()["levels"]


def _static_equals_dynamic(model, prompt, assert_greedy_equal, cfg: TriForceConfig, new_tokens: int, assistant=None):
    """Greedy equality with the static path, and the same drafts (acceptance counts) as the dynamic path over
    transformers' forward (the test asks for it with ``transformers_level1``: on a GPU the static steps replace that
    path; the CPU's direct forward rounds its own way, its products' outputs kept in bfloat16, and is checked against
    the model's forward in ``test_direct_forward.py``); both levels drafted (level 0 where the config has a
    drafter)."""
    ran = Ran(drafted=("level1",) if cfg.drafter == "none" else ("level0", "level1"))
    assert_greedy_equal(model, prompt, cfg, new_tokens, ran=ran, assistant_model=assistant)
    static_levels = _levels(model)
    weights = hf_triforce.last_stats(model).level1_weights  # the dynamic path's "auto" would pick int4
    dynamic = TriForceConfig(**{**cfg.to_dict(), "cuda_graphs": False, "level1_weights": weights})
    assert_greedy_equal(model, prompt, dynamic, new_tokens, ran=ran, assistant_model=assistant)
    assert hf_triforce.last_stats(model).level1_forward == "transformers"
    assert static_levels == _levels(model), "the static path drafted differently from the dynamic path"
    return static_levels


@pytest.mark.usefixtures("transformers_level1")
@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_greedy_equal_with_static_steps(zoo, make_prompt, assert_greedy_equal, runners, drafter):
    model = zoo.target("llama_gqa")
    assistant = zoo.draft("llama_gqa") if drafter == "model" else None
    prompt = make_prompt(200, seed=3, repetitive=drafter == "ngram")
    # A 40-token draft cache with 4 sinks evicts (and restarts) many times over 48 new tokens.
    cfg = TriForceConfig(**SMALL, drafter=drafter, cuda_graphs="eager", draft_cache_budget=40)
    kept_before = _kept_level1_steps(model)
    _static_equals_dynamic(model, prompt, assert_greedy_equal, cfg, 48, assistant)
    level1 = [r for r in runners if r.graph_widths == {1, 2, 3}]
    level0 = [r for r in runners if r.logits_to_keep == 1]
    assert len(level1) <= 1 and _kept_level1_steps(model) > kept_before  # built here, or kept from a test before
    assert len(level0) == (1 if drafter == "model" else 0)
    assert all(r.counts["eager"] > 0 for r in level0)
    assert not [r for r in runners if isinstance(r.cache, RetrievalCache)]  # the verification runs dynamic shapes
    assert all(r.counts["replay"] == r.counts["capture"] == 0 for r in runners)  # no CUDA here


def _kept_level1_steps(model) -> int:
    kept = state_of(model).level1_runner
    return 0 if kept is None else kept[1].counts["eager"]


def test_level1_runner_is_reused_across_calls(model_factory, make_prompt, assert_greedy_equal, runners):
    """Later generate() calls rebind the kept runner (no new captures on CUDA); other shapes or disable() drop it."""
    model = model_factory("llama_gqa", seed=5)
    cfg = TriForceConfig(**SMALL, drafter="ngram", cuda_graphs="eager")
    for length, seed in ((200, 1), (150, 2), (260, 3)):  # other prompts and lengths, same view shape
        assert_greedy_equal(model, make_prompt(length, seed=seed, repetitive=True), cfg, 24)
    assert len(runners) == 1 and _kept_level1_steps(model) == runners[0].counts["eager"]
    other = TriForceConfig(**{**cfg.to_dict(), "retrieval_budget": cfg.retrieval_budget + cfg.chunk_size})
    assert_greedy_equal(model, make_prompt(200, seed=4, repetitive=True), other, 16)
    state = state_of(model)
    assert len(runners) == 2 and state.level1_runner[1] is runners[1]
    hf_triforce.disable(model)
    assert state_of(model) is None and not hf_triforce.is_enabled(model)


@pytest.mark.usefixtures("transformers_level1")
def test_greedy_equal_with_full_acceptance(zoo, make_prompt, assert_greedy_equal, self_draft_config):
    """Target as its own level-0 drafter, whole sequence in the view: drafts run to their end (no crops)."""
    model = zoo.target("llama_gqa")
    cfg = self_draft_config(256, adaptive=False, draft_cache_budget=512, cuda_graphs="eager")
    levels = _static_equals_dynamic(model, make_prompt(50, seed=8), assert_greedy_equal, cfg, 37, model)
    assert levels["level0"]["acceptance_rate"] >= 0.9 and levels["level1"]["acceptance_rate"] >= 0.9


@pytest.mark.usefixtures("transformers_level1")
def test_greedy_equal_qwen2_with_refreshes(zoo, make_prompt, assert_greedy_equal):
    model, assistant = zoo.target("qwen2"), zoo.draft("qwen2")
    cfg = TriForceConfig(**{**SMALL, "refresh_every": 2}, drafter="model", cuda_graphs="eager")
    _static_equals_dynamic(model, make_prompt(150, seed=4), assert_greedy_equal, cfg, 32, assistant)
    assert hf_triforce.last_stats(model).retrieval_refreshes >= 3


@pytest.mark.usefixtures("transformers_level1")
def test_greedy_equal_with_eager_attention(model_factory, make_prompt, assert_greedy_equal):
    """The static path's additive (eager-attention) mask."""
    model = model_factory("llama_mha", seed=0)
    model.config._attn_implementation = "eager"
    cfg = TriForceConfig(**SMALL, drafter="ngram", cuda_graphs="eager")
    _static_equals_dynamic(model, make_prompt(120, seed=2, repetitive=True), assert_greedy_equal, cfg, 24)


def test_static_draft_cache_matches_dynamic(zoo, make_prompt):
    """Level 0: a ModelDrafter on static layers gives the dynamic one's logits, through evictions and restarts."""
    model = zoo.draft("llama_gqa")
    drafters = []
    for static in (False, True):
        cache = StreamingLLMCache(1, budget=24, sinks=4, inv_freq=layer_rotary(model)[0], evict_batch=4)
        drafter = ModelDrafter(model, cache, LogitsProcessorList(), do_sample=False)
        if static:
            drafter.use_static_steps("eager")
        drafters.append(drafter)
    sequence = make_prompt(120, seed=9)[0]
    max_diff = 0.0
    with torch.no_grad():
        # Catch-ups of 1..40 tokens (evictions), rollbacks of 3 tokens and one past the window (a restart).
        for end in [5, 6, 9, 10, 30, 31, 33, 36, 37, 35, 60, 61, 62, 40, 41, 100, 101, 103]:
            dynamic, static = (d._catch_up(sequence[:end]) for d in drafters)
            max_diff = max(max_diff, float((static - dynamic).abs().max()))
            torch.testing.assert_close(static, dynamic, atol=1e-5, rtol=1e-5)
            assert drafters[0].cache.get_seq_length() == drafters[1].cache.get_seq_length()
    assert drafters[1].runner.counts["eager"] == drafters[1].forwards


# ---------------------------------------------------------------------------------------------------
# The cuda_graphs setting


@pytest.mark.parametrize("value", ["yes", "graphs", 1, 0, None, "Auto"])
def test_bad_cuda_graphs_values(value):
    with pytest.raises(TriForceConfigError, match="cuda_graphs="):
        TriForceConfig(**SMALL, cuda_graphs=value)


@pytest.mark.parametrize("value", [True, False, "auto", "eager"])
def test_cuda_graphs_round_trip(value):
    cfg = TriForceConfig(**SMALL, cuda_graphs=value)
    assert TriForceConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["cuda_graphs"] is value or cfg.to_dict()["cuda_graphs"] == value


def test_graphs_on_a_cpu_model_raise_before_any_forward(zoo, make_prompt):
    model = zoo.target("llama_gqa")
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(UnsupportedDeviceError, match=r"cuda_graphs=True\) cannot run here: the model is on cpu"):
            model.generate(make_prompt(20), max_new_tokens=4, triforce_config=TriForceConfig(**SMALL, cuda_graphs=True))
    finally:
        handle.remove()
    assert not calls
    assert issubclass(UnsupportedDeviceError, TriForceError) and issubclass(UnsupportedDeviceError, ValueError)


@pytest.mark.parametrize("setting", [False, "auto"])
def test_default_cpu_path_is_dynamic(zoo, make_prompt, runners, setting):
    """The default is 'auto' (graphs where the model is on CUDA); on the CPU it runs the dynamic shapes, as False."""
    model = zoo.target("llama_gqa")
    model.generate(make_prompt(100), max_new_tokens=8, triforce_config=TriForceConfig(**SMALL, cuda_graphs=setting))
    assert TriForceConfig().cuda_graphs == "auto" and not runners


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("drafter", ["auto", "model", "ngram", "none"])
def test_the_default_plans_a_cpu_call_as_cuda_graphs_false_did(zoo, make_prompt, rows, drafter):
    """cuda_graphs='auto' became the default: on a CPU every field of the call's plan is what False gave."""
    model = zoo.target("llama_gqa")
    assistant = zoo.draft("llama_gqa") if drafter in ("auto", "model") else None
    ids = make_prompt(100).repeat(rows, 1)
    call = plan.Call(ids, GenerationConfig(max_length=120), {}, None, [], assistant, model)
    options = dict(drafter=drafter, tree_budget="auto")
    default = plan.plan_call(model, TriForceConfig(**options), call)
    assert default == plan.plan_call(model, TriForceConfig(**options, cuda_graphs=False), call)
    assert default.level1_steps == default.draft_steps == "dynamic" and not default.strict_graphs


def test_the_plan_reads_the_steps_a_cpu_model_can_run(zoo):
    facts = Facts(model_facts(zoo.target("llama_gqa")), TriForceConfig())
    assert [plan._steps(facts, setting) for setting in (False, "auto", "eager")] == ["dynamic", "dynamic", "eager"]
    with pytest.raises(UnsupportedDeviceError, match="not a CUDA device"):
        plan._steps(facts, True)


def test_model_facts_see_what_blocks_graphs(model_factory, monkeypatch):
    model = model_factory("llama_gqa", enable=False)
    facts = model_facts(model)
    assert not facts.dynamic_rope and facts.fixed_masks and static_steps.mask_kind(model) == "bool"
    monkeypatch.setattr(model.model.rotary_emb, "rope_type", "dynamic")
    assert model_facts(model).dynamic_rope  # graphs refused; eager fixed-shape steps do not mind host reads
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert static_steps.mask_kind(flash) is None
