"""Bad inputs fail early and clearly; enabling TriForce changes nothing else about a model.

Every bad input must raise a ``ValueError`` subclass whose message says what to change, *before* any
forward runs (checked with forward pre-hooks that count calls on the target and the draft model).
"""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM
from transformers.generation.streamers import BaseStreamer

import hf_triforce
from hf_triforce import (
    NoStatsError,
    TriForceConfig,
    TriForceConfigError,
    TriForceError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)

pytestmark = pytest.mark.integration

CFG = dict(chunk_size=8, retrieval_budget=64, recent_window=16)


@pytest.fixture
def no_forward(llama, llama_draft, forward_counter):
    counter = forward_counter(llama, llama_draft)
    yield counter
    counter.remove()
    assert counter.calls == 0


@pytest.fixture
def prompt():
    return torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------------------------------
# generate() options TriForce cannot serve


@pytest.mark.parametrize(
    "kwargs,hint",
    [
        (dict(num_beams=2), "num_beams"),
        (dict(num_beams=2, do_sample=True), "num_beams"),
        (dict(num_return_sequences=2), "num_return_sequences"),  # greedy: transformers' own check
        (dict(use_cache=False), "use_cache"),
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
        (dict(prompt_lookup_num_tokens=3), r"drafter='ngram', gamma1=N"),
        (dict(guidance_scale=1.5), "guidance_scale"),  # its processor steps the model on a cache of its own
    ],
    ids=["beams", "beam_sample", "return_sequences_greedy", "no_cache", "attentions", "lookup", "guidance"],
)
def test_unsupported_generation_options(llama, prompt, no_forward, kwargs, hint):
    with pytest.raises(ValueError, match=hint):
        llama.generate(prompt, max_new_tokens=5, triforce_config=TriForceConfig(**CFG), **kwargs)


class SilentStreamer(BaseStreamer):
    """A streamer that shows nothing (transformers puts the prompt into it before TriForce runs)."""

    def put(self, value) -> None:
        pass

    def end(self) -> None:
        pass


@pytest.mark.parametrize(
    "kwargs, hint",
    [
        (dict(right_padding=True), "a row whose last token is padding"),
        (dict(streamer=True), "a streamer with several rows"),
        (dict(output_logits=True, return_dict_in_generate=True), "output_scores / output_logits"),
    ],
    ids=["right_padding", "streamer", "output_logits"],
)
def test_batch_options_refused_before_work(llama, prompt, no_forward, kwargs, hint):
    """A batch (two rows, or one left-padded row) with what the batched loop cannot serve raises before any forward,
    naming it and what to do."""
    batch = torch.cat([prompt, prompt.flip(1)])
    mask = torch.ones_like(batch)
    mask[0, -3:] = 0 if kwargs.pop("right_padding", False) else 1
    if kwargs.pop("streamer", False):  # transformers' streamers take one row (a padded row is served)
        kwargs["streamer"] = SilentStreamer()
    with pytest.raises(UnsupportedGenerationError, match=hint) as info:
        llama.generate(batch, attention_mask=mask, max_new_tokens=5, triforce_config=TriForceConfig(**CFG), **kwargs)
    assert "A batch (several rows, or a left-padded row) cannot run here" in str(info.value)


@pytest.mark.parametrize("kwargs", [dict(num_beams=2), dict(num_beams=2, do_sample=True)])
def test_single_prompt_is_not_blamed_for_batch_size(llama, prompt, no_forward, kwargs):
    with pytest.raises(UnsupportedGenerationError) as info:
        llama.generate(prompt, max_new_tokens=5, triforce_config=TriForceConfig(**CFG), **kwargs)
    assert "batch size" not in str(info.value)


# ---------------------------------------------------------------------------------------------------
# Models


def test_assistant_with_another_vocabulary(llama, prompt, no_forward, model_factory, forward_counter):
    other = model_factory("llama_gqa", num_layers=1, seed=5, vocab_size=300, enable=False)
    watch = forward_counter(other)
    try:
        with pytest.raises(UnsupportedModelError, match="vocabulary") as info:
            llama.generate(
                prompt, max_new_tokens=5, triforce_config=TriForceConfig(drafter="model", **CFG), assistant_model=other
            )
    finally:
        watch.remove()
    message = str(info.value)
    assert "300" in message and "256" in message
    assert "drafter='ngram'" in message or "same family" in message


def tiny_gpt2():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_embd=64, n_layer=1, n_head=4, n_positions=512)
    return GPT2LMHeadModel(config).eval()


def tiny_opt():
    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=256,
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        word_embed_proj_dim=64,
        max_position_embeddings=512,
    )
    return OPTForCausalLM(config).eval()


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_opt], ids=["gpt2", "opt"])
def test_unsupported_family(factory, forward_counter):
    model = factory()
    counter = forward_counter(model)
    with pytest.raises(UnsupportedModelError) as info:
        hf_triforce.enable(model)
    counter.remove()
    message = str(info.value)
    assert model.config.model_type in message
    for family in ("llama", "mistral", "qwen2", "qwen3"):
        assert family in message
    assert not hf_triforce.is_enabled(model)
    assert "generate" not in vars(model), "a rejected model must keep its own generate()"


SMALL_SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1)  # fmt: skip
REFUSED = {
    "deepseek_v3-mla": ("DeepseekV3", dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        first_k_dense_replace=1, n_group=1, topk_group=1), "compressed KV"),
    "jamba-mamba": ("Jamba", dict(num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
                    expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4, mamba_dt_rank=4, mamba_expand=1),
                    "linear_attention"),
    "qwen3_next-linear": ("Qwen3Next", dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                          shared_expert_intermediate_size=16, head_dim=16, linear_num_value_heads=2,
                          linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8), "linear_attention"),
    "falcon_h1-hybrid": ("FalconH1", dict(mamba_d_ssm=32, mamba_n_heads=2, mamba_d_head=16, mamba_d_state=4,
                         mamba_expand=1, head_dim=16), "hybrid"),
    "bloom-no-attention-interface": ("Bloom", dict(n_layer=1, n_head=2), "attention interface"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_models_that_cannot_be_served_are_refused_with_the_reason(case, forward_counter):
    """Compressed-KV attention, state-space / linear-attention / hybrid layers, attention outside the interface:
    ``UnsupportedModelError`` from ``enable()``, naming what the model has, before any forward; the model keeps its
    own ``generate()``."""
    import transformers

    prefix, extra, reason = REFUSED[case]
    model = getattr(transformers, f"{prefix}ForCausalLM")(
        getattr(transformers, f"{prefix}Config")(**SMALL_SHAPE, **extra)
    )
    counter = forward_counter(model.eval())
    with pytest.raises(UnsupportedModelError, match=reason) as info:
        hf_triforce.enable(model)
    counter.remove()
    assert "plain generate" in str(info.value) or "served" in str(info.value)
    assert not hf_triforce.is_enabled(model) and "generate" not in vars(model)


def test_encoder_decoder_and_headless_models_are_refused():
    import transformers

    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32))  # fmt: skip
    with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
        hf_triforce.enable(bart)
    config = transformers.LlamaConfig(**SMALL_SHAPE)
    for headless in (transformers.LlamaModel(config), transformers.LlamaForSequenceClassification(config)):
        with pytest.raises(UnsupportedModelError, match="no causal LM head: load it with AutoModelForCausalLM"):
            hf_triforce.enable(headless)


def test_unsupported_assistant_family(llama, prompt, no_forward, forward_counter):
    gpt2 = tiny_gpt2()
    watch = forward_counter(gpt2)
    try:
        with pytest.raises(UnsupportedModelError, match="assistant_model") as info:
            llama.generate(
                prompt, max_new_tokens=5, triforce_config=TriForceConfig(drafter="model", **CFG), assistant_model=gpt2
            )
    finally:
        watch.remove()
    assert "gpt2" in str(info.value)


# ---------------------------------------------------------------------------------------------------
# TriForceConfig values

BAD_CONFIGS = [
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=-8), "chunk_size"),
    (dict(retrieval_budget=100, chunk_size=8), r"multiple of chunk_size=8; try 96"),
    (dict(retrieval_budget=72, chunk_size=8, recent_window=64), r"too small.*8 \+ 64 \+ 8 = 80"),
    (dict(retrieval_budget=16, chunk_size=8, recent_window=8), "too small"),
    (dict(recent_window=12, chunk_size=8), "recent_window"),
    (dict(recent_window="half"), r"recent_window='half' must be 'auto' or .*; try 'auto'"),
    (dict(recent_window=True), "recent_window=True must be 'auto'"),
    (dict(gamma1=0), "gamma1 must be an integer >= 1"),
    (dict(gamma2=0), "gamma2 must be an integer >= 1"),
    (dict(refresh_every=0), "refresh_every"),
    (dict(draft_cache_budget=4, gamma1=2), r"draft_cache_budget=4 is too small.*at least 19 tokens"),
    (dict(draft_cache_budget=20, gamma1=4), r"16 sink tokens and a step's gamma1 \+ 1, so it needs at least 21"),
    (dict(drafter="medusa"), r"drafter='medusa' is not one of"),
    (dict(gamma1=1.5), "gamma1"),
    (dict(gamma2=6.0), r"gamma2 must be an integer >= 1, got 6.0 \(write 6\)"),
    (dict(retrieval_budget="4096"), r"retrieval_budget must be 'auto' or an integer >= 8, got '4096' \(write 4096\)"),
    (dict(prefill_chunk_size=0), "prefill_chunk_size"),
    (dict(cuda_graphs="on"), r"cuda_graphs='on' is not one of True, False, 'auto', 'eager'"),
    (dict(adaptive=1), "adaptive must be True or False"),
    (dict(step_selection=True), r"step_selection=...\) was removed in hf_triforce 0.3: .*Drop step_selection"),
    (dict(draft_sinks=4), r"draft_sinks=...\) was removed .*16 sink tokens within draft_cache_budget"),
    (dict(drafter="suffix"), r"drafter='suffix' was removed in hf_triforce 0.3: use n-gram lookup \(drafter='ngram'"),
]


@pytest.mark.parametrize("kwargs,message", BAD_CONFIGS, ids=[str(k) for k, _ in BAD_CONFIGS])
def test_bad_config_values(kwargs, message):
    with pytest.raises(TriForceConfigError, match=message):
        TriForceConfig(**{**CFG, **kwargs})


@pytest.mark.parametrize("kwargs,message", BAD_CONFIGS[:4] + BAD_CONFIGS[6:8], ids=lambda v: str(v))
def test_bad_config_dict_passed_to_generate(llama, prompt, no_forward, kwargs, message):
    with pytest.raises(TriForceConfigError, match=message):
        llama.generate(prompt, max_new_tokens=5, triforce_config={**CFG, **kwargs})


def test_config_errors_are_value_errors():
    for cls in (TriForceConfigError, UnsupportedGenerationError, UnsupportedModelError):
        assert issubclass(cls, ValueError)


def test_model_drafter_without_assistant(llama, prompt, no_forward):
    with pytest.raises(TriForceConfigError, match="assistant_model="):
        llama.generate(prompt, max_new_tokens=5, triforce_config=TriForceConfig(drafter="model", **CFG))


def test_wrong_triforce_config_type(llama, prompt, no_forward):
    with pytest.raises(TriForceConfigError, match="TriForceConfig or a dict"):
        llama.generate(prompt, max_new_tokens=5, triforce_config=64)


def test_from_dict_unknown_key():
    data = {**TriForceConfig(**CFG).to_dict(), "budget": 64}
    with pytest.raises(TriForceConfigError, match=r"Unknown TriForceConfig fields \['budget'\].*retrieval_budget"):
        TriForceConfig.from_dict(data)


def test_from_dict_unknown_key_in_generate(llama, prompt, no_forward):
    with pytest.raises(TriForceConfigError, match="gamma3"):
        llama.generate(prompt, max_new_tokens=5, triforce_config={**CFG, "gamma3": 2})


# ---------------------------------------------------------------------------------------------------
# to_dict / from_dict


@st.composite
def valid_configs(draw):
    chunk = draw(st.integers(1, 64))
    recent = draw(st.just("auto") | st.builds(lambda n: chunk * n, st.integers(0, 16)))
    budget = 2 * chunk + (0 if recent == "auto" else recent) + chunk * draw(st.integers(0, 512))
    gamma1 = draw(st.integers(1, 16))
    return TriForceConfig(
        chunk_size=chunk,
        recent_window=recent,
        retrieval_budget=budget,
        gamma1=gamma1,
        gamma2=draw(st.integers(1, 32)),
        draft_cache_budget=16 + gamma1 + 1 + draw(st.integers(0, 4096)),
        refresh_every=draw(st.integers(1, 10_000)),
        drafter=draw(st.sampled_from(["auto", "model", "ngram", "none"])),
        prefill_chunk_size=draw(st.none() | st.integers(1, 100_000)),
        rescore_candidates=draw(st.integers(0, 8)),
        tree_budget=draw(st.sampled_from(["auto", 0, 2, 16])),
        adaptive=draw(st.booleans()),
        cuda_graphs=draw(st.sampled_from([True, False, "auto", "eager"])),
        offload_kv=draw(st.booleans()),
    )


@settings(max_examples=200, deadline=None)
@given(cfg=valid_configs())
def test_to_dict_from_dict_round_trip(cfg):
    data = cfg.to_dict()
    assert TriForceConfig.from_dict(data) == cfg
    assert TriForceConfig.from_dict(json.loads(json.dumps(data))) == cfg


@pytest.mark.parametrize(
    "kwargs,tokens",
    [
        (dict(), 128),  # retrieval_budget 'auto': a quarter of the smallest view (VIEW_FLOOR) until resolved
        (dict(retrieval_budget=4096), 1024),
        (dict(retrieval_budget=512), 128),
        (dict(retrieval_budget=384, chunk_size=8), 96),
        (dict(retrieval_budget=100, chunk_size=4), 24),  # 25 rounded down to whole chunks
        (dict(retrieval_budget=16, chunk_size=8), 0),  # the sink chunk and one retrieved chunk fill it
        (dict(retrieval_budget=512, recent_window=64), 64),  # an explicit window is kept as given
    ],
)
def test_auto_recent_window_is_a_quarter_of_the_budget(kwargs, tokens):
    cfg = TriForceConfig(**kwargs)
    assert cfg.recent_tokens == tokens
    assert cfg.min_retrieval_budget == 2 * cfg.chunk_size + tokens <= cfg.for_context(0).retrieval_budget


def test_default_config_round_trip():
    cfg = TriForceConfig()
    assert TriForceConfig.from_dict(cfg.to_dict()) == cfg
    assert TriForceConfig.from_dict({}) == cfg


# ---------------------------------------------------------------------------------------------------
# enable() leaves everything else alone


def test_enable_is_idempotent(prompt, model_factory):
    model = model_factory("llama_gqa", enable=False)
    assert hf_triforce.enable(model) is model
    wrapped = model.generate
    assert hf_triforce.enable(model) is model
    assert model.generate is wrapped
    cfg = TriForceConfig(**CFG)
    first = model.generate(prompt, max_new_tokens=6, do_sample=False, triforce_config=cfg)
    assert torch.equal(first, model.generate(prompt, max_new_tokens=6, do_sample=False, triforce_config=cfg))


def test_plain_generate_unchanged_after_enable(prompt, model_factory):
    enabled = model_factory("qwen2", enable=False)
    plain = copy.deepcopy(enabled)
    hf_triforce.enable(enabled)
    for kwargs in (dict(do_sample=False), dict(do_sample=True, temperature=0.8, top_k=20)):
        torch.manual_seed(3)
        expected = plain.generate(prompt, max_new_tokens=12, **kwargs)
        torch.manual_seed(3)
        got = enabled.generate(prompt, max_new_tokens=12, **kwargs)
        assert torch.equal(expected, got), kwargs
    # Also after a TriForce call, and with an assistant model (plain assisted generation).
    enabled.generate(prompt, max_new_tokens=4, triforce_config=TriForceConfig(**CFG))
    assert torch.equal(plain.generate(prompt, max_new_tokens=8), enabled.generate(prompt, max_new_tokens=8))
    draft = model_factory("qwen2", num_layers=1, seed=9, enable=False)
    expected = plain.generate(prompt, max_new_tokens=8, assistant_model=draft)
    assert torch.equal(expected, enabled.generate(prompt, max_new_tokens=8, assistant_model=draft))


def test_enabled_generation_config_still_serializes(tmp_path, model_factory):
    model = hf_triforce.enable(model_factory("llama_gqa", enable=False))
    json.loads(model.generation_config.to_json_string())
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path)
    assert reloaded.config.model_type == "llama"


def test_attn_implementation_unchanged(llama, prompt, forward_counter):
    before = llama.config._attn_implementation
    llama.generate(prompt, max_new_tokens=6, triforce_config=TriForceConfig(**CFG))
    assert llama.config._attn_implementation == before == "sdpa"
    counter = forward_counter(llama)  # the refusals below come before any forward
    with pytest.raises(UnsupportedGenerationError):
        llama.generate(prompt, max_new_tokens=6, num_beams=2, triforce_config=TriForceConfig(**CFG))
    assert llama.config._attn_implementation == before
    with pytest.raises(TriForceConfigError):
        llama.generate(prompt, max_new_tokens=6, triforce_config=TriForceConfig(**CFG, drafter="model"))
    counter.remove()
    assert counter.calls == 0
    assert llama.config._attn_implementation == before


class Boom(RuntimeError):
    pass


@contextlib.contextmanager
def failing_forward(model, at: int):
    """Within the block, the model's ``at``-th forward raises :class:`Boom`."""
    calls = {"n": 0}

    def hook(module, args):
        calls["n"] += 1
        if calls["n"] == at:
            raise Boom("injected failure")

    handle = model.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("fail_at", [1, 2, 5])
def test_attn_implementation_restored_after_a_failing_forward(llama, prompt, fail_at):
    """A forward that raises inside TriForce (mid-prefill or mid-decoding) leaves the model as it was."""
    with failing_forward(llama, fail_at), pytest.raises(Boom):
        llama.generate(prompt, max_new_tokens=20, triforce_config=TriForceConfig(**CFG))
    assert llama.config._attn_implementation == "sdpa"
    expected = llama.generate(prompt, max_new_tokens=10, do_sample=False)
    got = llama.generate(prompt, max_new_tokens=10, do_sample=False, triforce_config=TriForceConfig(**CFG))
    assert torch.equal(expected, got)


def test_last_stats_before_any_triforce_call(prompt, model_factory):
    never_enabled = model_factory("llama_gqa", enable=False)
    with pytest.raises(ValueError, match="triforce_config"):
        hf_triforce.last_stats(never_enabled)
    model = model_factory("llama_gqa")
    model.generate(prompt, max_new_tokens=3)  # plain generate does not produce TriForce stats
    with pytest.raises(NoStatsError, match="No TriForce generation"):
        hf_triforce.last_stats(model)
    model.generate(prompt, max_new_tokens=3, triforce_config=TriForceConfig(**CFG))
    assert hf_triforce.last_stats(model).new_tokens == 3


@pytest.mark.parametrize("failure", ["refused", "mid_decoding"])
def test_a_failed_call_leaves_no_statistics_behind(prompt, model_factory, failure):
    """``last_stats`` describes the latest call only: a call that raises (refused before any work, or failing in a
    forward mid-decoding) drops the previous call's statistics, so they cannot be read as its own."""
    model = model_factory("llama_gqa")
    model.generate(prompt, max_new_tokens=9, do_sample=False, triforce_config=TriForceConfig(**CFG))
    assert hf_triforce.last_stats(model).new_tokens == 9
    if failure == "refused":
        with pytest.raises(UnsupportedGenerationError):
            model.generate(prompt, max_new_tokens=5, num_beams=2, triforce_config=TriForceConfig(**CFG))
    else:
        with failing_forward(model, 3), pytest.raises(Boom):
            model.generate(prompt, max_new_tokens=20, triforce_config=TriForceConfig(**CFG))
    with pytest.raises(NoStatsError, match="raised before it finished"):
        hf_triforce.last_stats(model)
    model.generate(prompt, max_new_tokens=4, do_sample=False, triforce_config=TriForceConfig(**CFG))
    assert hf_triforce.last_stats(model).new_tokens == 4


def test_stored_default_config_is_used(prompt, model_factory):
    """``generation_config.triforce_config`` set on the model is used without passing it per call."""
    model = model_factory("llama_gqa")
    expected = model.generate(prompt, max_new_tokens=8, do_sample=False)
    model.generation_config.triforce_config = TriForceConfig(**CFG)
    try:
        got = model.generate(prompt, max_new_tokens=8, do_sample=False)
        assert torch.equal(expected, got)
        assert hf_triforce.last_stats(model).new_tokens == 8
    finally:
        model.generation_config.triforce_config = None


def test_disable_restores_the_class_generate(prompt, model_factory):
    model = model_factory("llama_gqa", enable=False)
    hf_triforce.enable(model)
    model.generate(prompt, max_new_tokens=4, triforce_config=TriForceConfig(**CFG))
    assert hf_triforce.disable(model) is model
    assert "generate" not in vars(model) and not hasattr(model.generation_config, "triforce_config")
    assert hf_triforce.disable(model) is model
    with pytest.raises(NoStatsError, match="No TriForce"):
        hf_triforce.last_stats(model)
    with pytest.raises(ValueError, match="triforce_config"):
        model.generate(prompt, max_new_tokens=4, triforce_config=TriForceConfig(**CFG))


@pytest.mark.parametrize(
    "prompt_length,new_tokens,match", [(4096, 4, "the prompt has 4096 tokens"), (4000, 200, "at most 96")]
)
def test_context_limit_is_an_error_before_any_forward(llama, no_forward, prompt_length, new_tokens, match):
    prompt = torch.zeros(1, prompt_length, dtype=torch.long)
    assert llama.config.max_position_embeddings == 4096
    with pytest.raises(UnsupportedGenerationError, match=match):
        llama.generate(prompt, max_new_tokens=new_tokens, triforce_config=TriForceConfig(**CFG))


def test_stop_strings_without_a_tokenizer_are_refused_before_any_work(llama, prompt, no_forward):
    with pytest.raises(UnsupportedGenerationError, match=r"stop_strings=.*Pass tokenizer=<your tokenizer>"):
        llama.generate(prompt, max_new_tokens=5, stop_strings=["."], triforce_config=TriForceConfig(**CFG))


def test_generate_before_enable_names_enable(model_factory, prompt, forward_counter):
    """The likeliest first mistake: triforce_config on a model hf_triforce.enable() never saw. transformers would say
    only "model_kwargs are not used"; the package raises its own error naming the fix, before any forward, and the
    same after disable()."""
    model = model_factory("llama_gqa", enable=False)
    counter = forward_counter(model)
    try:
        for _ in range(2):
            with pytest.raises(hf_triforce.NotEnabledError, match=r"hf_triforce\.enable\(model\) was not called"):
                model.generate(prompt, max_new_tokens=4, triforce_config=TriForceConfig(**CFG))
            hf_triforce.enable(model)
            hf_triforce.disable(model)
    finally:
        counter.remove()
    assert issubclass(hf_triforce.NotEnabledError, TriForceError) and issubclass(
        hf_triforce.NotEnabledError, ValueError
    )
    with pytest.raises(ValueError, match="are not used by the model") as caught:  # other typos: transformers' error
        model.generate(prompt, max_new_tokens=4, triforce_cnfig=TriForceConfig(**CFG))
    assert not isinstance(caught.value, TriForceError)
    out = model.generate(prompt, max_new_tokens=4, custom_generate=hf_triforce.triforce_generate,
                         triforce_config=TriForceConfig(**CFG))  # fmt: skip
    assert out.shape[1] == prompt.shape[1] + 4


@pytest.mark.parametrize(("tokens", "notices"), [(40, 1), (64, 1), (65, 0)])
def test_a_prompt_the_view_holds_whole_is_noted_once(llama, make_prompt, caplog, tokens, notices):
    """retrieval_budget=64: a prompt of at most 64 tokens fits level 1's view whole, so retrieval saves nothing: one
    logged line per call says so (not a print, not one per round)."""
    with caplog.at_level("WARNING", logger="hf_triforce"):
        llama.generate(make_prompt(tokens), max_new_tokens=12, triforce_config=TriForceConfig(**CFG))
    lines = [r for r in caplog.records if "no longer than level 1's view" in r.getMessage()]
    assert len(lines) == notices
    if notices:
        assert (
            f"the prompt ({tokens} tokens)" in lines[0].getMessage() and "retrieval_budget=64" in lines[0].getMessage()
        )
