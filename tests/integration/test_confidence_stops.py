"""Level-1 rounds that stop by confidence: the drafter obeys the planner's stop, reports each drafted token's
confidence, and the output stays exactly plain ``generate()``'s wherever a round stops.

The stop itself is timing-dependent (:meth:`~hf_triforce.hierarchy.planner.Planner.keep_drafting` weighs measured
costs); these tests force it either way to check the mechanics, and the greedy and sampling suites run with it on
(the adaptive default).
"""

from __future__ import annotations

import pytest
import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hierarchy.level1 import Level1Drafter
from hf_triforce.hierarchy.planner import Plan, Planner

pytestmark = pytest.mark.integration

SMALL = dict(chunk_size=8, retrieval_budget=64, recent_window=16, refresh_every=4, drafter="none", gamma2=5)


def rounds_seen(monkeypatch) -> list[tuple[int, int, list[float]]]:
    """``(room, drafted, confidences)`` of every ``"levels"`` round: the most tokens the round may draft (the plan's
    length, within the room ``max_length`` leaves), the tokens drafted, and level 1's confidence in each as the
    planner is told of it with the verdict."""
    seen: list[tuple[int, int, list[float]]] = []
    draft, observe = Level1Drafter.draft, Planner.observe_level2

    def draft_spy(self, plan, rows, budgets):
        drafts = draft(self, plan, rows, budgets)
        if plan.kind == "levels":
            (room,), (row_draft,) = budgets, drafts  # one sequence: the plan's length within max_length's room
            seen.append((room, row_draft.tokens.shape[0], []))
        return drafts

    def observe_spy(self, plan, drafted, accepted, seconds, confidences=None, rank=None, requested=None):
        if plan.kind == "levels" and drafted:
            seen[-1][2].extend(confidences or [])
        return observe(self, plan, drafted, accepted, seconds, confidences, rank, requested)

    monkeypatch.setattr(Level1Drafter, "draft", draft_spy)
    monkeypatch.setattr(Planner, "observe_level2", observe_spy)
    return seen


@pytest.mark.parametrize("stop", [True, False])
def test_rounds_stop_where_the_planner_says(llama, make_prompt, assert_greedy_equal, monkeypatch, stop):
    """Stopping after every level-1 step gives one-token rounds; never stopping gives ``gamma2``-token rounds; the
    text is plain greedy's either way."""
    seen = rounds_seen(monkeypatch)
    monkeypatch.setattr(Planner, "keep_drafting", lambda self, drafted, survival: not stop)
    monkeypatch.setattr(Planner, "_probe", lambda self: None)  # every round a "levels" round
    monkeypatch.setattr(Planner, "_best", lambda self: Plan("levels", 1))
    assert_greedy_equal(llama, make_prompt(90, seed=3), TriForceConfig(**SMALL), 24)
    assert seen and all(drafted == min(1 if stop else 5, room) for room, drafted, _ in seen)


def test_confidences_are_level1_probabilities(llama, make_prompt, monkeypatch):
    """The planner is told level 1's probability of each drafted token, one per token, in (0, 1]."""
    seen = rounds_seen(monkeypatch)
    torch.manual_seed(0)  # sampled: greedy rounds run their planned length, no confidence decides them
    cfg = TriForceConfig(**SMALL)
    llama.generate(make_prompt(90, seed=4), max_new_tokens=20, do_sample=True, top_k=0, triforce_config=cfg)
    assert seen
    for _, drafted, confidences in seen:
        assert len(confidences) == drafted
        assert all(0.0 < c <= 1.0 for c in confidences)


def test_without_adaptive_rounds_keep_their_length(llama, make_prompt, monkeypatch):
    """``adaptive=False``: every round drafts ``gamma2``, whatever level 1's confidence."""
    seen = rounds_seen(monkeypatch)
    config = TriForceConfig(**{**SMALL, "adaptive": False})
    llama.generate(make_prompt(90, seed=5), max_new_tokens=24, do_sample=False, triforce_config=config)
    assert seen and all(drafted == min(5, room) for room, drafted, _ in seen)
    assert all(not c for _, _, c in seen)  # no confidence is computed when nothing is decided from it


@pytest.mark.parametrize("stop", [True, False])
def test_sampled_rounds_that_stop_early(llama, make_prompt, monkeypatch, stop):
    """Sampling with forced stops runs and yields the requested length (the distribution suites check exactness)."""
    monkeypatch.setattr(Planner, "keep_drafting", lambda self, drafted, survival: not stop)
    torch.manual_seed(0)
    out = llama.generate(
        make_prompt(90, seed=6), max_new_tokens=16, min_new_tokens=16, do_sample=True, temperature=0.8,
        triforce_config=TriForceConfig(**SMALL),
    )  # fmt: skip
    assert out.shape[1] == 90 + 16
    assert hf_triforce.last_stats(llama).new_tokens == 16
