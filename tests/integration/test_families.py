"""Every family of the test matrix (``tests/support/families.py``): TriForce is plain ``generate()``, losslessly.

For each of the 24 families, a tiny random model with a 200-token prompt (three times the 64-token retrieval budget,
40 where every layer slides; four times the 48-token sliding window of the families that have one):

* greedy output identical to plain ``generate()`` with each level-0 drafter (n-gram, a 1-layer draft model
  of the same family), level 1 drafting over a sparse view and rejected, level 0 drafting;
* with a view that holds the whole sequence, level 1 computes what level 2 computes: its drafts are accepted, so the
  accepting path (whole rounds, level 2's bonus) runs for every family too;
* a left-padded batch of two prompts identical to plain batched ``generate()`` (sliding-window layers attend within
  each query's window as plain ``generate()`` counts it; soft-capped and sink-carrying attention through the model's
  own attention, given the batch's slots as its mask);
* a reused prefilled cache (``DynamicCache()``: plain layers, which keep every token) identical to plain
  ``generate()`` from the same cache;
* sampled output distributed like plain sampling (the chi-square test of ``test_sampling_distribution.py``, smaller:
  ``SAMPLES`` runs) for one family of each attention kind (``families.SAMPLED``).

What makes a family's attention differ (soft-capping, QK-norm, partial and interleaved rotary, learned sinks, expert
routing over a multi-token verification, decoder layers that drop their kwargs) is in its model; each case fails if
TriForce's verification or level 1 mishandles it (a verification forward over several tokens that computes other
logits than a one-token step changes the greedy tokens).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.caches.streaming import StreamingLLMCache
from hf_triforce.hf.model import layer_rotary
from hf_triforce.hf.versions import cache_kwargs
from tests.support.families import BY_TYPE, FAMILIES, SAMPLED, build, markdown_table
from tests.support.homogeneity import describe, homogeneity_test, window_codes
from tests.support.speculation import Ran

pytestmark = pytest.mark.integration

TYPES = [family.model_type for family in FAMILIES]
PROMPT = 200
NEW_TOKENS = 24
SPARSE = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False,
              draft_cache_budget=48)  # fmt: skip
ALL_SLIDING = [family.model_type for family in FAMILIES if family.all_sliding]
"""Families whose every layer slides. At a budget of 47 tokens or more their level 1 is the target (a sliding layer's
view is the 47 tokens it holds, its window: :func:`test_a_sliding_layer_s_view_is_its_window`), so level 1 never
rejects; the matrix's other cases run them at budget 40, where level 1 sees only the last 40 of them."""


def sparse(model_type: str) -> dict:
    """The matrix's sparse settings for ``model_type``: budget 40 where every layer slides, else 64."""
    return {**SPARSE, "retrieval_budget": 40} if model_type in ALL_SLIDING else SPARSE


class FamilyZoo:
    """Each family's TriForce-enabled target (4 layers) and 1-layer draft model, built once."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], torch.nn.Module] = {}

    def target(self, model_type: str) -> torch.nn.Module:
        if (model_type, "target") not in self.models:
            self.models[model_type, "target"] = hf_triforce.enable(build(model_type, seed=TYPES.index(model_type)))
        return self.models[model_type, "target"]

    def draft(self, model_type: str) -> torch.nn.Module:
        if (model_type, "draft") not in self.models:
            self.models[model_type, "draft"] = build(model_type, num_layers=1, seed=100 + TYPES.index(model_type))
        return self.models[model_type, "draft"]


@pytest.fixture(scope="module")
def families() -> FamilyZoo:
    return FamilyZoo()


def prompt_ids(seed: int = 0, length: int = PROMPT) -> torch.LongTensor:
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("drafter", ["ngram", "model"])
@pytest.mark.parametrize("model_type", TYPES)
def test_greedy_equals_plain_generate(families, assert_greedy_equal, model_type, drafter):
    model = families.target(model_type)
    assistant = families.draft(model_type) if drafter == "model" else None
    ran = Ran(drafted=("level0", "level1"), rejected=("level1",))
    cfg = TriForceConfig(drafter=drafter, **sparse(model_type))
    assert_greedy_equal(model, prompt_ids(), cfg, NEW_TOKENS, ran=ran, assistant_model=assistant)


@pytest.mark.parametrize("model_type", TYPES)
def test_fixed_shape_steps_equal_plain_generate(families, assert_greedy_equal, model_type):
    """``cuda_graphs="eager"``: level 1's steps over the view's fixed storage (what a CUDA graph replays; the mask over
    every slot read by grouped sdpa or the model's own attention)."""
    model = families.target(model_type)
    cfg = TriForceConfig(drafter="ngram", cuda_graphs="eager", **sparse(model_type))
    assert_greedy_equal(model, prompt_ids(seed=2), cfg, NEW_TOKENS, ran=Ran(drafted=("level1",), rejected=("level1",)))


@pytest.mark.parametrize("model_type", TYPES)
def test_a_view_of_the_whole_sequence_is_accepted(families, assert_greedy_equal, model_type):
    """Budget >= prompt + new tokens and the target's own weights: level 1 is level 2, so whole rounds are accepted
    (level 2's bonus token) in every family, sliding layers included (their window over a contiguous view)."""
    cfg = TriForceConfig(drafter="none", **{**SPARSE, "retrieval_budget": 256}, level1_weights="full")
    ran = Ran(accepted=("level1",), full_rounds=True)
    assert_greedy_equal(families.target(model_type), prompt_ids(1), cfg, NEW_TOKENS, ran=ran)
    assert hf_triforce.last_stats(families.target(model_type)).level1.per_token_acceptance > 0.9


@pytest.mark.parametrize("model_type", ALL_SLIDING)
def test_a_sliding_layer_s_view_is_its_window(families, assert_greedy_equal, model_type):
    """Budget 64 of a 200-token sequence: every layer's view is the 47 tokens its sliding layer of the full cache holds
    (its window; no chunk summaries, no retrieval), at their true positions under the model's sliding mask, so level 1
    computes what level 2 computes and every draft is accepted. A view of the sink, the retrieved chunks and 16 recent
    tokens (the selection without windows) accepts 0-8% of them."""
    cfg = TriForceConfig(drafter="none", **SPARSE, level1_weights="full")
    ran = Ran(accepted=("level1",), full_rounds=True)
    assert_greedy_equal(families.target(model_type), prompt_ids(5), cfg, NEW_TOKENS, ran=ran)
    assert hf_triforce.last_stats(families.target(model_type)).level1.per_token_acceptance == 1.0


@pytest.mark.parametrize("given", ["model's generation config", "the call"])
def test_hub_default_hybrid_cache_is_served_as_plain_generate_serves_it(families, assert_greedy_equal, given):
    """Gemma checkpoints ship ``generation_config.cache_implementation="hybrid"``, which transformers drops for the
    dynamic sliding-window cache: TriForce drops it too (the same tokens), set by the Hub or by the call."""
    model = families.target("gemma3_text")
    kwargs = {"cache_implementation": "hybrid"} if given == "the call" else {}
    model.generation_config.cache_implementation = None if kwargs else "hybrid"
    try:
        cfg = TriForceConfig(drafter="ngram", **SPARSE)
        assert_greedy_equal(model, prompt_ids(6), cfg, NEW_TOKENS, ran=Ran(drafted=("level1",)), **kwargs)
    finally:
        model.generation_config.cache_implementation = None


def test_a_cache_implementation_transformers_keeps_is_refused_from_the_model_s_config_too(families):
    model = families.target("gemma3_text")
    model.generation_config.cache_implementation = "static"
    try:
        with pytest.raises(hf_triforce.UnsupportedGenerationError, match="cache_implementation='static'"):
            model.generate(prompt_ids(), max_new_tokens=4, triforce_config=TriForceConfig(**SPARSE))
    finally:
        model.generation_config.cache_implementation = None


def left_padded_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """``([2, 200], [2, 200])``: a 200- and a 150-token prompt, left-padded with id 0, and their mask."""
    ids = torch.cat([prompt_ids(2), torch.cat([torch.zeros(1, 50, dtype=torch.long), prompt_ids(3, 150)], 1)])
    mask = torch.ones_like(ids)
    mask[1, :50] = 0
    return ids, mask


@pytest.mark.parametrize("model_type", TYPES)
def test_batch(families, assert_ran, model_type):
    """A left-padded batch equals plain batched ``generate()``, windows several times shorter than the prompts
    included."""
    model = families.target(model_type)
    ids, mask = left_padded_pair()
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    cfg = TriForceConfig(drafter="ngram", **sparse(model_type))
    expected = model.generate(ids, **kwargs)
    got = model.generate(ids, triforce_config=cfg, **kwargs)
    assert torch.equal(expected, got), (expected[:, -16:], got[:, -16:])
    for row in hf_triforce.last_stats(model).rows:
        assert_ran(row, drafted=("level1",), rejected=("level1",))


@pytest.mark.parametrize("model_type", TYPES)
def test_reused_cache(families, assert_ran, model_type):
    """From a ``DynamicCache()`` prefilled with 150 of the 200 prompt tokens: plain ``generate()``'s tokens."""
    model = families.target(model_type)
    prompt = prompt_ids(4)
    prefix = DynamicCache()  # plain layers: every token kept, also for sliding-window layers
    with torch.no_grad():
        model(input_ids=prompt[:, :150], use_cache=True, **cache_kwargs(prefix))
    common = dict(max_new_tokens=16, do_sample=False)
    expected = model.generate(prompt, **common, **cache_kwargs(copy.deepcopy(prefix)))
    got = model.generate(prompt, triforce_config=TriForceConfig(drafter="ngram", **sparse(model_type)), **common,
                         **cache_kwargs(copy.deepcopy(prefix)))  # fmt: skip
    assert torch.equal(expected, got)
    assert hf_triforce.last_stats(model).reused_tokens == 150
    assert_ran(model, rejected=("level1",))


# ---------------------------------------------------------------------------------------------------------------
# Sampling: one family per attention kind

VOCAB = 8
SAMPLES = 300
"""TriForce runs per family (against ``PLAIN_SAMPLES`` rows of one plain call): fewer than the main sampling test's
1000, a check per attention kind of the machinery whose power that test shows."""
PLAIN_SAMPLES = 2000
"""Rows of the plain sample each TriForce sample is tested against (:func:`plain_sample`: one prefill, then cheap)."""
ALPHA = 1e-3
WINDOWS = ((0, 1, 2), (3, 4, 5))
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_p": 0.9}
SAMPLING_CONFIG = dict(retrieval_budget=32, chunk_size=4, recent_window=8, refresh_every=2, gamma1=2, gamma2=4,
                       draft_cache_budget=40, drafter="model", adaptive=False)  # fmt: skip


def plain_sample(model, prompt: torch.LongTensor, rows: int) -> torch.LongTensor:
    """``[rows, prompt + 6]``: plain sampled ``generate()`` (``SAMPLING``) of ``prompt``'s 6 next tokens, ``rows``
    independent continuations of one prefilled cache: the prompt but its last token prefilled once and repeated
    over the rows (``Cache.batch_repeat_interleave``), as a user continues a shared prefix. ``num_return_sequences``
    prefills every row itself: 34 of the gpt_oss case's 47 s on CI's cores, against about 1 s this way."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt[:, :-1], use_cache=True, **cache_kwargs(cache))
    cache.batch_repeat_interleave(rows)
    return model.generate(prompt.expand(rows, -1), max_new_tokens=6, **SAMPLING, **cache_kwargs(cache))


def new_tokens(sequences: torch.Tensor, start: int) -> np.ndarray:
    return sequences[:, start : start + len(WINDOWS) * 3].numpy()


@pytest.mark.parametrize("model_type", SAMPLED)
def test_sampled_triforce_is_distributed_like_plain_generate(model_type):
    """The prefill's token and one whole round (6 new tokens) of a 2-layer model (a sliding and a full layer for
    hybrid families, the 200-token prompt four windows long) against plain sampling: each 3-token window passes the
    chi-square homogeneity test at ``ALPHA / 2``; level 1 rejected some drafts and accepted some whole rounds."""
    with torch.random.fork_rng(devices=[]):
        target = hf_triforce.enable(build(model_type, num_layers=2, seed=0, vocab_size=VOCAB))
        draft = build(model_type, num_layers=1, seed=100, vocab_size=VOCAB)
        prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(1_000_003)
        plain = plain_sample(target, prompt, PLAIN_SAMPLES)
        config = TriForceConfig(**SAMPLING_CONFIG)
        runs, drafted, rejected, whole = [], 0, 0, 0
        for seed in range(SAMPLES):
            torch.manual_seed(seed)
            runs.append(target.generate(prompt, max_new_tokens=6, triforce_config=config, assistant_model=draft,
                                        **SAMPLING))  # fmt: skip
            stats = hf_triforce.last_stats(target)
            drafted, rejected = drafted + stats.level1.drafted, rejected + stats.level1.rejections
            whole += stats.rounds.get("levels", 0) - stats.level1.rejections
    got, expected = new_tokens(torch.cat(runs), PROMPT), new_tokens(plain, PROMPT)
    for window in WINDOWS:
        codes = [window_codes(tokens, window, VOCAB) for tokens in (expected, got)]
        p_value, table, labels = homogeneity_test(*codes, VOCAB, 3)
        assert p_value > ALPHA / len(WINDOWS), (
            f"{model_type}: TriForce sampling is not distributed like plain generate() on new tokens "
            f"{[i + 1 for i in window]} (p = {p_value:.3g}).\n" + describe(table, labels, ("plain", "triforce"))
        )
    assert drafted > 0 and rejected > 0 and whole > 0, (drafted, rejected, whole)


def test_sampled_batch_with_windows_is_distributed_like_plain_generate():
    """Gemma 2 (soft-capped logits, a sliding and a full layer, windows of 48 tokens) sampled as a batch: two prompts,
    left-padded (30 padding tokens before the first, 10 before the second's 20 extra tokens), each repeated
    ``SAMPLES / 2`` times in one batched call; each prompt's rows against plain sampling of that prompt alone (the
    windows counted as plain ``generate()`` counts them, the model's own eager attention over the batch's slots)."""
    config = TriForceConfig(**{k: v for k, v in SAMPLING_CONFIG.items() if not k.startswith("draft")}, drafter="ngram")
    with torch.random.fork_rng(devices=[]):
        target = hf_triforce.enable(build("gemma2", num_layers=2, seed=0, vocab_size=VOCAB))
        prompt = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(1))
        longer = torch.cat([torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2)), prompt], 1)
        torch.manual_seed(1_000_003)
        plain = [plain_sample(target, p, PLAIN_SAMPLES) for p in (prompt, longer)]
        batch = torch.cat(
            [torch.cat([prompt.new_zeros(1, 30), prompt], 1), torch.cat([longer.new_zeros(1, 10), longer], 1)]
        )
        mask = (torch.arange(130)[None] >= torch.tensor([[30], [10]])).long()
        torch.manual_seed(0)
        got = target.generate(batch, attention_mask=mask, pad_token_id=0, max_new_tokens=6, triforce_config=config,
                              num_return_sequences=SAMPLES // 2, **SAMPLING)  # fmt: skip
    stats = hf_triforce.last_stats(target)
    rows = got.view(2, SAMPLES // 2, -1)
    for b, (expected, start) in enumerate(zip(plain, (100, 120), strict=True)):
        got_tokens, expected_tokens = new_tokens(rows[b], 130), new_tokens(expected, start)
        for window in WINDOWS:
            codes = [window_codes(tokens, window, VOCAB) for tokens in (expected_tokens, got_tokens)]
            p_value, table, labels = homogeneity_test(*codes, VOCAB, 3)
            assert p_value > ALPHA / len(WINDOWS) / 2, (
                f"gemma2 batch, prompt {b}: not distributed like plain generate() on new tokens "
                f"{[i + 1 for i in window]} (p = {p_value:.3g}).\n" + describe(table, labels, ("plain", "triforce"))
            )
    assert stats.level1.drafted > 0 and stats.level1.rejections > 0, stats.level1


# ---------------------------------------------------------------------------------------------------------------
# The docs' table


def test_supported_models_page_shows_the_matrix():
    """``docs/supported-models.md`` carries the table this matrix generates (``python -m tests.support.families``)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "supported-models.md").read_text()
    assert markdown_table() in page, "regenerate the table: python -m tests.support.families"


# ---------------------------------------------------------------------------------------------------------------
# Moving cached keys: the level-0 draft cache's re-rotation in each family's own rotary layout

ROTARY = [("phi3", None), ("stablelm", None), ("glm4", None), ("cohere", None), ("llama", None),
          ("gemma3_text", "sliding_attention"), ("gemma3_text", "full_attention")]  # fmt: skip


@pytest.mark.parametrize("model_type, kind", ROTARY, ids=[f"{t}-{k}" if k else t for t, k in ROTARY])
def test_evicted_keys_are_the_keys_the_model_computes_at_their_new_positions(model_type, kind):
    """A StreamingLLM cache that evicts 5 window tokens moves the later ones down 5 slots, re-rotating their keys;
    they must equal the keys the model's own forward computes at the new positions (the first layer's keys depend
    on the token and position only). Partial rotary (Phi-3, StableLM, GLM-4), interleaved channel pairs (Cohere,
    GLM-4) and Gemma 3's local and global bases each fail this without their handling."""
    family = BY_TYPE[model_type]
    if kind is not None:
        family = dataclasses.replace(family, config={**family.config, "layer_types": [kind]})
    model = build(family, num_layers=1, seed=3)
    freqs, interleaved = layer_rotary(model)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(5))
    cache = StreamingLLMCache(1, budget=24, sinks=4, inv_freq=freqs, evict_batch=0, interleaved=interleaved)
    reference = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.arange(20)[None], use_cache=True, **cache_kwargs(cache))
        cache.layers[0].evict(5)  # tokens 9..19 move from slots 9..19 to 4..14
        model(input_ids=ids[:, 9:], position_ids=torch.arange(4, 15)[None], use_cache=True, **cache_kwargs(reference))
    moved = cache.layers[0].buffer.keys[:, :, 4:15]
    torch.testing.assert_close(moved, reference.layers[0].keys, atol=1e-5, rtol=1e-5)


def test_each_layer_rotates_with_its_own_kind_s_base():
    """Gemma 3's sliding and full layers have rotary bases of their own: the draft cache gets each layer's."""
    model = build("gemma3_text", num_layers=2)  # layer types: sliding, full
    freqs, _ = layer_rotary(model)
    rotary = model.model.rotary_emb
    assert torch.equal(freqs[0], rotary.sliding_attention_inv_freq.float())
    assert torch.equal(freqs[1], rotary.full_attention_inv_freq.float())
    assert not torch.equal(freqs[0], freqs[1])


# ---------------------------------------------------------------------------------------------------------------
# Expert routing over a multi-token verification

MOE = [family.model_type for family in FAMILIES if "mixture of experts" in family.features]


def _routing_and_logits(model: torch.nn.Module, prompt: torch.Tensor, width: int, at_once: bool):
    """Each router's expert choice per token (``[width, top_k]`` per router) and the ``[width, V]`` logits of the
    last ``width`` tokens of ``prompt``, forwarded at once (a verification) or one at a time (plain decoding)."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    chosen: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(routers))}
    hooks = [r.register_forward_hook(lambda _m, _i, out, i=i: chosen[i].append(out[2])) for i, r in enumerate(routers)]
    try:
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=prompt[:, :-width], use_cache=True, **cache_kwargs(cache))
            for values in chosen.values():
                values.clear()
            pieces = [prompt[:, -width:]] if at_once else list(prompt[:, -width:].split(1, dim=1))
            logits = torch.cat([model(input_ids=p, use_cache=True, **cache_kwargs(cache)).logits[0] for p in pieces])
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(values) for values in chosen.values()], logits


def assert_routed_per_token(model: torch.nn.Module, prompt: torch.Tensor, width: int = 6) -> None:
    """A ``width``-token forward routes every token to the experts a one-token step routes it to, with the same
    logits (what a TriForce verification needs of a mixture of experts)."""
    routed, logits = _routing_and_logits(model, prompt, width, at_once=True)
    stepped, step_logits = _routing_and_logits(model, prompt, width, at_once=False)
    assert routed and all(torch.equal(a, b) for a, b in zip(routed, stepped, strict=True)), "routing differs"
    torch.testing.assert_close(logits, step_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", MOE)
def test_a_verification_routes_each_token_as_a_step_does(families, model_type, monkeypatch):
    """Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss route each token of a 6-token verification to the experts a
    one-token step chooses, with the same logits: the property TriForce's multi-token verification relies on (the
    greedy and sampled cases above show its output). A router coupled across the tokens of a forward (here: routing
    every token by the tokens' mean) is caught by the same check."""
    model = families.target(model_type)
    assert_routed_per_token(model, prompt_ids(6))
    router = next(type(m) for m in model.modules() if type(m).__name__.endswith("TopKRouter"))
    forward = router.forward
    monkeypatch.setattr(router, "forward", lambda self, h: forward(self, h.mean(dim=-2, keepdim=True).expand_as(h)))
    with pytest.raises(AssertionError):
        assert_routed_per_token(model, prompt_ids(6))
