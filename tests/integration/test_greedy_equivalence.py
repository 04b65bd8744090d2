"""Greedy TriForce output is token-identical to plain greedy ``generate()`` on tiny random models.

The cases cover (without the full cartesian product): every supported family, every drafter, prompt
lengths around the chunk size and the retrieval budget, 1/2/7/64 new tokens, gamma1 1..3 and gamma2
1..8, frequent and acceptance-triggered retrieval refreshes, EOS and max_new_tokens landing inside a
draft, logits processors, and a level-0 draft cache that has to evict (StreamingLLM).

Random tiny models give level 1 (a sparse view) a low acceptance, so most cases exercise the
rejection paths. The acceptance paths are exercised with a retrieval budget that holds the whole
sequence (level 1 then computes what level 2 computes) and with the target itself as the level-0
draft model (``assistant_model=model``), where every level agrees and drafts run to their end.

Equal tokens alone would also come from a TriForce that decodes plainly, so every case asserts from the call's
own statistics that the path it names ran (``Ran`` in ``conftest.py``: drafts at each level it exercises, and
rejections where it is meant to reject). The schedule is fixed (``adaptive=False``) or forced (``force_plans``),
so which paths run does not depend on the machine's timings; ``test_adaptive_schedule_mix`` covers the planner's
own choice.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hf_triforce
from hf_triforce import TriForceConfig
from tests.support.speculation import LEVELS, NOTHING, Ran

# TriForceConfig fields deprecated in 0.2 (removed in 0.3) that these tests still exercise
pytestmark = [
    pytest.mark.integration,
]

# chunk 8, budget 64, recent 16: the boundaries the prompt lengths below straddle. A fixed schedule: every round
# runs level 0 -> 1 -> 2 (the planner's timing-driven choice is tested on its own).
SMALL = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, adaptive=False)


def small_config(**overrides) -> TriForceConfig:
    return TriForceConfig(**{**SMALL, **overrides})


def assistant_for(zoo, drafter: str, family: str = "llama_gqa"):
    return zoo.draft(family) if drafter in ("model", "auto+assistant") else None


def config_drafter(drafter: str) -> str:
    return "auto" if drafter == "auto+assistant" else drafter


def sparse_ran(drafter: str) -> Ran:
    """A sparse view (prompt beyond the budget): level 1 drafts and is rejected; a level-0 drafter drafts too."""
    return Ran(drafted=("level1",) if drafter == "none" else ("level0", "level1"), rejected=("level1",))


# ---------------------------------------------------------------------------------------------------
# Families x drafters


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "auto+assistant"])
@pytest.mark.parametrize("family", ["llama_mha", "llama_gqa", "mistral", "qwen2", "qwen3"])
def test_every_family_and_drafter(zoo, make_prompt, assert_greedy_equal, family, drafter):
    model = zoo.target(family)
    prompt = make_prompt(200, seed=3, repetitive=drafter == "ngram")
    cfg = small_config(drafter=config_drafter(drafter))
    assistant = assistant_for(zoo, drafter, family)
    assert_greedy_equal(model, prompt, cfg, 24, ran=sparse_ran(drafter), assistant_model=assistant)
    stats = hf_triforce.last_stats(model).to_dict()
    assert stats["new_tokens"] == 24
    level0_drafts = stats["levels"]["level0"]["drafted"] + stats["levels"]["level0_to_level2"]["drafted"]
    assert (level0_drafts == 0) == (drafter == "none")


# ---------------------------------------------------------------------------------------------------
# Schedules: each round kind forced (level 0 -> 2, plain steps, mixed), and the adaptive planner's own mix

SCHEDULES = [("level0",), ("levels", "level0", "plain"), ("plain", "level0", "levels", "levels")]


@pytest.mark.parametrize("kinds", SCHEDULES, ids="-".join)
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_forced_schedules(zoo, llama, make_prompt, assert_greedy_equal, force_plans, drafter, kinds):
    """Level 2 judging level 0's drafts directly (a one-hot ``q`` or the draft model's), alone and between the other
    kinds of round: the draft cache, the view and the level-0 state must follow every switch."""
    force_plans(*kinds)
    prompt = make_prompt(200, seed=17, repetitive=drafter != "model")
    drafted = ("level0_to_level2",) + (("level0", "level1") if "levels" in kinds else ())
    ran = Ran(drafted=drafted, rejected=("level0_to_level2",), rounds=kinds)
    assert_greedy_equal(
        llama, prompt, small_config(drafter=drafter), 40, ran=ran, assistant_model=assistant_for(zoo, drafter)
    )


@pytest.mark.parametrize("family", ["llama_mha", "mistral", "qwen2", "qwen3"])
def test_forced_schedules_other_families(zoo, make_prompt, assert_greedy_equal, force_plans, family):
    force_plans("levels", "level0", "plain")
    ran = Ran(drafted=LEVELS, rejected=("level1", "level0_to_level2"), rounds=("levels", "level0", "plain"))
    cfg = small_config(drafter="model")
    assert_greedy_equal(
        zoo.target(family), make_prompt(200, seed=18), cfg, 40, ran=ran, assistant_model=zoo.draft(family)
    )


@pytest.mark.parametrize("drafter", ["model", "none"])
def test_adaptive_schedule_mix(zoo, llama, make_prompt, assert_greedy_equal, drafter):
    """The planner's own choice (``adaptive=True``): lossless whatever it picks. Its first round runs level 1 (never
    judged yet); a random model's drafts are rejected, so plain steps follow. Whether level 0 drafts inside it, and
    whether level 0 -> 2 is probed, follows the costs this machine timed (on a slow CI machine level 0 drafted
    nothing): the forced-schedule tests above run those paths on purpose."""
    cfg = small_config(drafter=drafter, adaptive=True)
    assistant = assistant_for(zoo, drafter)
    ran = Ran(drafted=("level1",), rounds=("levels", "plain"))
    assert_greedy_equal(llama, make_prompt(200, seed=19), cfg, 48, ran=ran, assistant_model=assistant)


# ---------------------------------------------------------------------------------------------------
# Prompt lengths around chunk_size (8) and retrieval_budget (64), new-token counts 1, 2, 7, 64

LENGTHS = [5, 8, 9, 63, 64, 65, 300, 700]


@pytest.mark.parametrize("new_tokens", [1, 2, 7, 64])
@pytest.mark.parametrize("length", LENGTHS)
def test_prompt_lengths_ngram(llama, make_prompt, assert_greedy_equal, length, new_tokens):
    prompt = make_prompt(length, seed=length, repetitive=length % 2 == 0)
    # 1 new token is the prefill's; with 2 the one round has no room to draft (the last token is never drafted)
    ran = NOTHING if new_tokens <= 2 else Ran(drafted=("level0", "level1") if length % 2 == 0 else ("level1",))
    out = assert_greedy_equal(llama, prompt, small_config(drafter="ngram"), new_tokens, ran=ran)
    assert out.shape[1] == length + new_tokens
    assert hf_triforce.last_stats(llama).new_tokens == new_tokens


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("drafter", ["none", "model"])
def test_prompt_lengths_other_drafters(zoo, llama, make_prompt, assert_greedy_equal, length, drafter):
    prompt = make_prompt(length, seed=1000 + length)
    new_tokens = 64 if length in (9, 65, 700) else 7
    ran = Ran(drafted=("level1",) if drafter == "none" else ("level0", "level1"))
    assert_greedy_equal(
        llama, prompt, small_config(drafter=drafter), new_tokens, ran=ran, assistant_model=assistant_for(zoo, drafter)
    )


@pytest.mark.parametrize("length", [40, 56, 57])
def test_generation_crosses_the_budget(llama, make_prompt, assert_greedy_equal, length):
    """The prompt fits the budget but prompt + new tokens does not: the view becomes sparse mid-generation."""
    prompt = make_prompt(length, seed=7)
    assert_greedy_equal(llama, prompt, small_config(drafter="ngram", refresh_every=3), 40)
    assert hf_triforce.last_stats(llama).retrieval_refreshes > 1


# ---------------------------------------------------------------------------------------------------
# Gammas

GAMMAS = [(1, 1), (1, 4), (1, 8), (2, 3), (2, 6), (3, 2), (3, 5), (3, 8)]


@pytest.mark.parametrize("gamma1,gamma2", GAMMAS)
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_gammas(zoo, llama, make_prompt, assert_greedy_equal, drafter, gamma1, gamma2):
    prompt = make_prompt(120, seed=gamma1 * 10 + gamma2, repetitive=True)
    cfg = small_config(drafter=drafter, gamma1=gamma1, gamma2=gamma2, draft_cache_budget=64)
    # with gamma2 == 1 a level-1 step has no room for level-0 drafts
    ran = sparse_ran(drafter) if gamma2 > 1 else Ran(rejected=("level1",))
    assert_greedy_equal(llama, prompt, cfg, 29, ran=ran, assistant_model=assistant_for(zoo, drafter))
    stats = hf_triforce.last_stats(llama)
    assert stats.rounds == {"levels": stats.target_forwards}, stats.rounds  # the fixed schedule, every round
    assert stats.level1.drafted <= gamma2 * stats.target_forwards
    # every round but those cut at max_length drafts gamma2 level-1 tokens (no EOS here)
    assert stats.level1.drafted >= gamma2 * (stats.target_forwards - gamma2), stats.to_dict()["levels"]
    # each level-1 step verifies up to gamma1 level-0 drafts (the gate may pause level 0)
    assert stats.level0.drafted <= gamma1 * stats.level1.drafted


@pytest.mark.parametrize("gamma1,gamma2", [(1, 1), (2, 5), (3, 8)])
def test_gammas_with_full_acceptance(llama, make_prompt, assert_greedy_equal, self_draft_config, gamma1, gamma2):
    """Target as its own level-0 drafter and a budget holding everything: every draft is accepted."""
    prompt = make_prompt(50, seed=gamma2)
    cfg = self_draft_config(
        256,
        gamma1=gamma1,
        gamma2=gamma2,
        level1_weights="full",  # level 1 = level 2 up to float noise (the int8 copy would reject a few)
        adaptive=False,  # the fixed schedule's mechanics
        draft_cache_budget=512,
    )
    ran = Ran(drafted=("level0", "level1") if gamma2 > 1 else ("level1",), full_rounds=True)
    assert_greedy_equal(llama, prompt, cfg, 37, ran=ran, assistant_model=llama)
    stats = hf_triforce.last_stats(llama)
    if gamma2 > 1:  # with gamma2 == 1 level 1 drafts one token per round and level 0 has no room
        assert stats.level0.drafted > 0 and stats.level0.acceptance_rate >= 0.9
    assert stats.level1.acceptance_rate >= 0.9
    if gamma2 > 1:
        assert stats.mean_accepted_length > 1.5


# ---------------------------------------------------------------------------------------------------
# Retrieval refreshes


@pytest.mark.parametrize("refresh_every", [1, 4, 7, 16])
def test_refreshes(llama, make_prompt, assert_greedy_equal, refresh_every):
    prompt = make_prompt(300, seed=refresh_every)
    cfg = small_config(drafter="ngram", refresh_every=refresh_every, adaptive=False)
    assert_greedy_equal(llama, prompt, cfg, 40, ran=Ran(rejected=("level1",)))
    stats = hf_triforce.last_stats(llama)
    assert stats.retrieval_refreshes >= 2, "a refresh should have happened mid-generation"


# ---------------------------------------------------------------------------------------------------
# A fixed schedule


def test_fixed_schedule_drafts_level0_every_step(llama, make_prompt, assert_greedy_equal):
    """adaptive=False: every level-1 step asks level 0 for gamma1 drafts (with the target as its own drafter every one
    is accepted, so each step adds gamma1 + 1 tokens)."""
    prompt = make_prompt(50, seed=3)
    cfg = small_config(
        drafter="model",
        retrieval_budget=256,
        gamma1=2,
        gamma2=6,
        adaptive=False,
        level1_weights="full",  # the target drafting for itself: every draft accepted
    )
    assert_greedy_equal(llama, prompt, cfg, 37, ran=Ran(drafted=("level0", "level1")), assistant_model=llama)
    stats = hf_triforce.last_stats(llama)
    steps = stats.level1.drafted - stats.level0.accepted  # every level-1 step adds one token of its own
    assert stats.level0.drafted >= 2 * (steps - 2), (stats.level0.drafted, steps)


# ---------------------------------------------------------------------------------------------------
# EOS and max_new_tokens inside a draft


def first_new_token_at(output: torch.Tensor, prompt_length: int, index: int) -> tuple[int, int]:
    """A token of the generated part at or after ``index`` that does not occur before it there.

    Returns ``(token, position in the generated part)``.
    """
    new = output[0, prompt_length:].tolist()
    for i in range(index, len(new)):
        if new[i] not in new[:i]:
            return new[i], i
    pytest.fail(f"no fresh token from new token {index} of the plain output to use as EOS: the fixture changed")


@pytest.mark.parametrize(
    "setting",
    ["self_draft", "full_budget_ngram", "sparse_ngram", "sparse_model", "self_draft_late"],
)
def test_eos_inside_a_draft(zoo, llama, make_prompt, assert_greedy_equal, self_draft_config, setting):
    prompt = make_prompt(60, seed=11)
    max_new = 48
    plain = llama.generate(prompt, max_new_tokens=max_new, do_sample=False)
    eos, at = first_new_token_at(plain, prompt.shape[1], 20 if setting == "self_draft_late" else 9)
    if setting.startswith("self_draft"):
        # every round drafts (adaptive=False): the planner's timing may otherwise choose plain steps
        cfg = self_draft_config(256, adaptive=False)
        assistant = llama
    elif setting == "full_budget_ngram":
        cfg = TriForceConfig(chunk_size=8, retrieval_budget=256, recent_window=16, drafter="ngram", adaptive=False)
        assistant = None
    elif setting == "sparse_ngram":
        cfg, assistant = small_config(drafter="ngram", gamma2=8), None
    else:
        cfg, assistant = small_config(drafter="model", gamma1=3, gamma2=8), zoo.draft("llama_gqa")
    ran = Ran(drafted=("level0", "level1") if assistant is not None else ("level1",))
    out = assert_greedy_equal(llama, prompt, cfg, max_new, ran=ran, eos_token_id=eos, assistant_model=assistant)
    assert out.shape[1] == prompt.shape[1] + at + 1
    assert int(out[0, -1]) == eos
    stats = hf_triforce.last_stats(llama)
    assert stats.new_tokens == at + 1
    if setting.startswith("self_draft"):
        assert stats.mean_accepted_length > 2, "EOS should have been reached inside an accepted draft"


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 7, 11, 13])
def test_max_new_tokens_inside_a_draft(llama, make_prompt, assert_greedy_equal, self_draft_config, max_new):
    """gamma2 (8) larger than max_new_tokens, and max_new_tokens not a multiple of the accepted length."""
    prompt = make_prompt(33, seed=max_new)
    # every level agrees only with the target's own weights; a fixed schedule, so every round drafts
    cfg = self_draft_config(128, level1_weights="full", adaptive=False)
    ran = NOTHING if max_new <= 2 else Ran(drafted=("level0", "level1") if max_new > 3 else ("level1",))
    out = assert_greedy_equal(llama, prompt, cfg, max_new, ran=ran, assistant_model=llama)
    assert out.shape[1] == 33 + max_new
    stats = hf_triforce.last_stats(llama)
    assert stats.new_tokens == max_new
    # every level agrees, and a draft cut at max_length is recorded as what was judged, not as a rejection
    assert stats.level0.rejections == stats.level1.rejections == stats.level0_to_level2.rejections == 0
    assert stats.level1.drafted == 0 or stats.level1.per_token_acceptance == 1.0


@pytest.mark.parametrize("max_new", [3, 10])
def test_max_length_instead_of_max_new_tokens(llama, make_prompt, max_new):
    prompt = make_prompt(20, seed=5)
    cfg = small_config(drafter="none", gamma2=8)
    expected = llama.generate(prompt, max_length=20 + max_new, do_sample=False)
    got = llama.generate(prompt, max_length=20 + max_new, do_sample=False, triforce_config=cfg)
    assert torch.equal(expected, got)
    stats = hf_triforce.last_stats(llama)
    assert stats.new_tokens == max_new and stats.level1.drafted > 0


# ---------------------------------------------------------------------------------------------------
# Logits processors under greedy


@pytest.mark.parametrize(
    "kwargs",
    [
        {"repetition_penalty": 1.3},
        {"no_repeat_ngram_size": 2},
        {"suppress_tokens": [1, 2, 3, 4]},
        {"bad_words_ids": [[7], [8, 9]]},
    ],
    ids=["repetition_penalty", "no_repeat_ngram", "suppress_tokens", "bad_words"],
)
def test_logits_processors(zoo, llama, make_prompt, assert_greedy_equal, kwargs):
    prompt = make_prompt(90, seed=2, repetitive=True)
    cfg = small_config(drafter="model", gamma1=2, gamma2=5)
    ran = Ran(drafted=("level0", "level1"), rejected=("level0", "level1"))
    assert_greedy_equal(llama, prompt, cfg, 30, ran=ran, assistant_model=zoo.draft("llama_gqa"), **kwargs)


def test_min_new_tokens_holds_back_eos(llama, make_prompt, assert_greedy_equal):
    prompt = make_prompt(40, seed=13)
    plain = llama.generate(prompt, max_new_tokens=30, do_sample=False)
    eos, at = first_new_token_at(plain, 40, 2)
    cfg = TriForceConfig(chunk_size=8, retrieval_budget=128, recent_window=16, drafter="model", gamma2=6,
                         adaptive=False)  # fmt: skip
    out = assert_greedy_equal(
        llama, prompt, cfg, 30, ran=Ran(drafted=("level0", "level1")), eos_token_id=eos, min_new_tokens=at + 5,
        assistant_model=llama,
    )  # fmt: skip
    assert out.shape[1] - 40 >= at + 5


def test_scores_match_plain_generate(llama, make_prompt, assert_ran):
    """``return_dict_in_generate`` with scores: same sequences, per-step processed scores equal up to float noise."""
    prompt = make_prompt(100, seed=4)
    kwargs = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)
    plain = llama.generate(prompt, **kwargs)
    tri = llama.generate(prompt, triforce_config=small_config(drafter="ngram"), **kwargs)
    assert torch.equal(plain.sequences, tri.sequences)
    assert len(plain.scores) == len(tri.scores) == 12
    assert_ran(llama, drafted=("level1",), rejected=("level1",))  # scores of accepted drafts and of corrections
    for a, b in zip(plain.scores, tri.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Stats

STATS_KEYS = {
    "new_tokens",
    "seconds",
    "prefill_seconds",
    "target_forwards",
    "decoded_tokens",
    "retrieval_refreshes",
    "mean_accepted_length",
    "levels",
}
LEVEL_KEYS = {"drafted", "accepted", "rejections", "acceptance_rate", "per_token_acceptance"}


def check_stats(stats: dict, new_tokens: int, gamma2: int, gamma1: int) -> None:
    assert STATS_KEYS <= set(stats)
    assert set(stats["levels"]) == {"level0", "level1", "level0_to_level2"}
    assert sum(stats["rounds"].values()) == stats["target_forwards"]
    assert stats["new_tokens"] == new_tokens
    assert stats["decoded_tokens"] == new_tokens - 1, "the prefill forward produces the first token"
    assert 0 <= stats["prefill_seconds"] <= stats["seconds"]
    assert stats["target_forwards"] <= max(new_tokens - 1, 0)
    if new_tokens > 1:  # a round per verification, and every token after the first came from one
        assert stats["target_forwards"] >= 1
    if stats["target_forwards"]:
        assert stats["mean_accepted_length"] == pytest.approx(stats["decoded_tokens"] / stats["target_forwards"])
        assert 1.0 <= stats["mean_accepted_length"] <= gamma1 + gamma2 + 1
    for level in stats["levels"].values():
        assert set(level) == LEVEL_KEYS
        assert 0 <= level["accepted"] <= level["drafted"]
        assert 0.0 <= level["acceptance_rate"] <= 1.0
        if level["drafted"]:
            assert level["acceptance_rate"] == pytest.approx(level["accepted"] / level["drafted"])
        # a round ends with at most one rejection, and drafts after it are never judged: alpha >= the round rate
        assert level["rejections"] <= level["drafted"] - level["accepted"]
        assert 0.0 <= level["acceptance_rate"] <= level["per_token_acceptance"] <= 1.0
    retrieval, direct = stats["levels"]["level1"], stats["levels"]["level0_to_level2"]
    assert retrieval["rejections"] <= stats["rounds"].get("levels", 0)
    assert direct["rejections"] <= stats["rounds"].get("level0", 0)
    assert retrieval["drafted"] <= gamma2 * stats["rounds"].get("levels", 0)
    assert direct["drafted"] <= (gamma1 + gamma2) * stats["rounds"].get("level0", 0)
    assert stats["decoded_tokens"] <= retrieval["accepted"] + direct["accepted"] + stats["target_forwards"]


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_stats_are_consistent(zoo, llama, make_prompt, assert_ran, drafter):
    prompt = make_prompt(150, seed=21, repetitive=True)
    cfg = small_config(drafter=drafter)
    out = llama.generate(
        prompt, max_new_tokens=25, do_sample=False, triforce_config=cfg, assistant_model=assistant_for(zoo, drafter)
    )
    stats = hf_triforce.last_stats(llama).to_dict()
    check_stats(stats, out.shape[1] - prompt.shape[1], cfg.gamma2, cfg.gamma1)
    assert stats["retrieval_refreshes"] >= 1
    assert_ran(stats, sparse_ran(drafter))


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_full_budget_retrieval_acceptance(llama, make_prompt, assert_ran, drafter):
    """With budget >= prompt + new tokens, level 1 sees every token: it equals level 2 up to float noise."""
    prompt = make_prompt(60, seed=8)
    cfg = TriForceConfig(
        chunk_size=8, retrieval_budget=128, recent_window=16, drafter=drafter, adaptive=False, level1_weights="full"
    )
    expected = llama.generate(prompt, max_new_tokens=40, do_sample=False)
    out = llama.generate(prompt, max_new_tokens=40, do_sample=False, triforce_config=cfg)
    assert torch.equal(expected, out)
    stats = hf_triforce.last_stats(llama).to_dict()
    check_stats(stats, 40, cfg.gamma2, cfg.gamma1)
    assert stats["levels"]["level1"]["acceptance_rate"] >= 0.9
    assert stats["mean_accepted_length"] > 3
    assert_ran(stats, drafted=("level1",), full_rounds=True)


def test_stats_describe_the_latest_call(llama, make_prompt):
    prompt = make_prompt(30, seed=1)
    llama.generate(prompt, max_new_tokens=9, do_sample=False, triforce_config=small_config())
    first = hf_triforce.last_stats(llama)
    llama.generate(prompt, max_new_tokens=4, do_sample=False, triforce_config=small_config())
    second = hf_triforce.last_stats(llama)
    assert first.new_tokens == 9 and second.new_tokens == 4


# ---------------------------------------------------------------------------------------------------
# Level-0 draft cache that evicts (StreamingLLM)


@pytest.mark.parametrize("assistant", ["tiny", "self"])
def test_draft_cache_evicts(zoo, llama, make_prompt, assert_greedy_equal, assistant):
    prompt = make_prompt(700, seed=31, repetitive=assistant == "tiny")
    cfg = small_config(drafter="model", gamma1=3, gamma2=6, draft_cache_budget=64, refresh_every=8)
    draft = zoo.draft("llama_gqa") if assistant == "tiny" else llama
    assert_greedy_equal(llama, prompt, cfg, 64, ran=sparse_ran("model"), assistant_model=draft)
    stats = hf_triforce.last_stats(llama)
    check_stats(stats.to_dict(), 64, cfg.gamma2, cfg.gamma1)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_draft_cache_evicts_other_families(zoo, make_prompt, assert_greedy_equal, family):
    model = zoo.target(family)
    prompt = make_prompt(400, seed=32)
    cfg = small_config(drafter="model", draft_cache_budget=32, gamma1=2)
    assert_greedy_equal(model, prompt, cfg, 48, ran=sparse_ran("model"), assistant_model=zoo.draft(family))


# ---------------------------------------------------------------------------------------------------
# A randomized sweep over valid configurations (a covering complement to the hand-picked cases)


@st.composite
def sweep_cases(draw):
    chunk = draw(st.sampled_from([4, 8, 16]))
    recent = draw(st.sampled_from(["auto", 0, chunk, 2 * chunk, 3 * chunk]))
    budget = 2 * chunk + (0 if recent == "auto" else recent) + chunk * draw(st.integers(0, 8))
    gamma1, gamma2 = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    cfg = TriForceConfig(
        chunk_size=chunk,
        recent_window=recent,
        retrieval_budget=budget,
        gamma1=gamma1,
        gamma2=gamma2,
        refresh_every=draw(st.integers(1, 20)),
        rescore_candidates=draw(st.sampled_from([0, 0, 1, 4])),
        drafter=draw(st.sampled_from(["none", "ngram", "model", "auto"])),
        draft_cache_budget=16 + gamma1 + 1 + draw(st.integers(0, 60)),
        tree_budget=draw(st.sampled_from(["auto", 0, 4])),
        adaptive=draw(st.booleans()),
    )
    return {
        "cfg": cfg,
        "length": draw(st.integers(1, 260)),
        "new_tokens": draw(st.integers(1, 40)),
        "assistant": draw(st.sampled_from(["tiny", "self"])),
        "repetitive": draw(st.booleans()),
        "seed": draw(st.integers(0, 10_000)),
    }


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=sweep_cases())
def test_randomized_configs(zoo, llama, make_prompt, assert_greedy_equal, case):
    cfg = case["cfg"]
    prompt = make_prompt(case["length"], seed=case["seed"], repetitive=case["repetitive"])
    uses_model = cfg.drafter == "model" or (cfg.drafter == "auto" and case["assistant"] == "tiny")
    assistant = (llama if case["assistant"] == "self" else zoo.draft("llama_gqa")) if uses_model else None
    # Three new tokens leave the first round room to draft, and the first round always speculates: with a fixed
    # schedule every round does, and the adaptive planner tries level 0 -> 1 -> 2 first, before it has any timing.
    ran = Ran() if case["new_tokens"] >= 3 else NOTHING
    out = assert_greedy_equal(llama, prompt, cfg, case["new_tokens"], ran=ran, assistant_model=assistant)
    check_stats(hf_triforce.last_stats(llama).to_dict(), out.shape[1] - prompt.shape[1], cfg.gamma2, cfg.gamma1)


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_prefill(llama, make_prompt, assert_greedy_equal, chunk):
    prompt = make_prompt(300, seed=41)
    assert_greedy_equal(llama, prompt, small_config(drafter="ngram", prefill_chunk_size=chunk), 24)
    assert hf_triforce.last_stats(llama).phases.calls["prefill"] == 1


def test_draft_catch_up_larger_than_the_draft_cache(zoo, llama, make_prompt, assert_greedy_equal):
    """Found by the sweep: with a draft cache of 16 sinks and a 2-token window, catching up on more new tokens than
    the window holds must not overflow it."""
    cfg = TriForceConfig(chunk_size=4, retrieval_budget=8, recent_window=0, gamma1=1, gamma2=2, refresh_every=1,
                         drafter="model", draft_cache_budget=18)  # fmt: skip
    prompt = make_prompt(1, seed=0)
    assert_greedy_equal(llama, prompt, cfg, 7, assistant_model=zoo.draft("llama_gqa"))
    prompt = make_prompt(60, seed=1, repetitive=True)
    assert_greedy_equal(llama, prompt, cfg, 30, assistant_model=zoo.draft("llama_gqa"))
