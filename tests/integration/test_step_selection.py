"""``TriForceConfig.step_selection``: re-ranking the view's chunks inside every level-1 forward stays lossless.

Level 1 only drafts, so any view is lossless; these tests check that the re-ranking really runs (chunks are swapped,
layer by layer, with each layer's own query), that greedy output still equals plain ``generate()``, that a sampled
call runs, and that the option is refused before any work where level 1 does not run its direct forward (beside the
int4 refusals in tests/integration/test_level1_weights.py). (That a swapped view holds exactly a fresh selection for
the new queries: tests/unit/test_retrieval_cache.py.)
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.errors import TriForceConfigError
from hf_triforce.hierarchy import level1_steps

# TriForceConfig fields deprecated in 0.2 (removed in 0.3) that these tests still exercise
pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:step_selection:FutureWarning"),
]

SMALL = dict(chunk_size=8, retrieval_budget=48, recent_window=16, gamma1=2, gamma2=5, adaptive=False)


@pytest.mark.parametrize("family", ["llama_gqa", "qwen3"])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
@pytest.mark.parametrize("rescore", [0, 4])  # the refreshes' ranking; the per-layer one ranks every chunk by its keys
def test_greedy_equals_plain_generate_and_chunks_are_swapped(
    zoo, make_prompt, assert_greedy_equal, family, drafter, rescore
):
    model = zoo.target(family)
    cfg = TriForceConfig(drafter=drafter, step_selection=True, rescore_candidates=rescore, **SMALL)
    assert_greedy_equal(model, make_prompt(160, seed=4, repetitive=drafter == "ngram"), cfg, 40)
    stats = hf_triforce.last_stats(model)
    assert stats.step_selection and stats.level1.drafted > 0
    assert stats.phases.calls.get("reselect", 0) > 0  # a re-ranking before level-1 steps
    assert stats.chunks_swapped > 0  # and the random model's queries moved chunks in


def test_the_fixed_shape_swap_cuda_uses_gives_the_same_drafts(zoo, make_prompt, assert_greedy_equal, monkeypatch):
    """On CUDA level 1 swaps chunks without waiting for the device (``ChunkSwapper(sync_free=True)``: fixed shapes,
    every middle slot rewritten). Forced here on the CPU, it is lossless and, with the schedule fixed, drafts and
    swaps exactly what the default way does: the same chunks arrive, whichever slots they take."""
    model, prompt = zoo.target("llama_gqa"), make_prompt(160, seed=4)
    cfg = TriForceConfig(step_selection=True, **SMALL)
    counts = {}
    for sync_free in (False, True):
        monkeypatch.setattr(level1_steps, "swaps_without_waiting", lambda model, flag=sync_free: flag)
        assert_greedy_equal(model, prompt, cfg, 40)
        stats = hf_triforce.last_stats(model)
        assert type(stats.chunks_swapped) is int
        counts[sync_free] = (stats.chunks_swapped, stats.level1.drafted, stats.level1.accepted)
    assert counts[True] == counts[False] and counts[True][0] > 0


def test_off_by_default_and_nothing_is_re_ranked(llama, make_prompt):
    llama.generate(
        make_prompt(160, seed=4), max_new_tokens=20, do_sample=False, triforce_config=TriForceConfig(**SMALL)
    )
    stats = hf_triforce.last_stats(llama)
    assert not stats.step_selection and stats.chunks_swapped == 0 and "reselect" not in stats.phases.calls


def test_a_prompt_within_the_budget_has_nothing_to_re_rank(llama, make_prompt, assert_greedy_equal):
    cfg = TriForceConfig(step_selection=True, **{**SMALL, "retrieval_budget": 256})
    assert_greedy_equal(llama, make_prompt(100, seed=2), cfg, 20)
    assert hf_triforce.last_stats(llama).chunks_swapped == 0


def test_sampled_call_runs_to_length(llama, make_prompt):
    cfg = TriForceConfig(drafter="ngram", step_selection=True, rescore_candidates=2, **SMALL)
    torch.manual_seed(0)
    out = llama.generate(make_prompt(160, seed=5), max_new_tokens=30, min_new_tokens=30, do_sample=True,
                         temperature=0.8, top_p=0.9, triforce_config=cfg)  # fmt: skip
    assert out.shape[1] == 190 and hf_triforce.last_stats(llama).phases.calls.get("reselect", 0) > 0


@pytest.mark.parametrize("value", ["auto", 1, None])
def test_config_takes_a_bool_only(value):
    with pytest.raises(TriForceConfigError, match="step_selection"):
        TriForceConfig(step_selection=value)
