"""The adaptive schedule: decisions from measured costs and acceptances (no model; costs are fed in)."""

from __future__ import annotations

import pytest

from hf_triforce import TriForceConfig
from hf_triforce.hierarchy.cost_model import Acceptance, StepCost, StreakAcceptance, expected_tokens
from hf_triforce.hierarchy.planner import PROBE_EVERY, Plan, Planner

pytestmark = pytest.mark.unit


def planner(drafter=True, **config) -> Planner:
    return Planner(TriForceConfig(**{"gamma1": 3, "gamma2": 6, **config}), has_drafter=drafter)


def feed(p: Planner, c2=(0.10, 0.002), c1=(0.03, 0.004), c0=0.0002, a1=0.95, a0=0.7, a02=0.5, rounds=30) -> None:
    """Costs ``c(w) = a + b (w - 1)`` of level-2 and level-1 forwards, level 0 per call, and steady acceptances."""
    for w in range(1, 12):
        p.level2.observe(w, c2[0] + c2[1] * (w - 1))
    for w in range(1, 5):
        p.level1.observe(w, c1[0] + c1[1] * (w - 1))
    for k in range(1, 12):
        p.level0.observe(k, c0)
    for _ in range(rounds):
        p.a1.observe(6, round(6 * a1) if a1 < 1 else 6)
        p.a0.observe(3, 3 if a0 >= 1 else (1 if a0 < 0.6 else 2))
        p.a02.observe(6, round(6 * a02))
    p.rounds = 1000
    p.last_tried = dict.fromkeys(["levels", "level0", "plain"], 1000)


def test_fixed_schedule_when_not_adaptive():
    p = planner(adaptive=False)
    assert [p.plan_round() for _ in range(3)] == [Plan("levels", 6)] * 3
    assert p.gamma1() == 3


def test_first_rounds_try_every_schedule_speculating_first():
    p = planner()
    assert [p.plan_round().kind for _ in range(3)] == ["levels", "level0", "plain"]
    assert p.gamma1() == 3  # level 0 is tried before anything is known of it
    assert [planner(drafter=False).plan_round().kind for _ in range(1)] == ["levels"]


def test_long_context_speculates_through_level1():
    """A full-cache step costing 3x a level-1 step, level 1 accepted 95%: the longest level-1 rounds."""
    p = planner()
    feed(p)
    plan = p.plan_round()
    assert plan == Plan("levels", 6)
    assert p.rate(plan) > 2 * p.rate(Plan("plain", 0))


def test_short_context_without_a_good_drafter_decodes_plainly():
    """Level 1 costs what level 2 costs and level 0 misses: plain steps are the fastest lossless schedule."""
    p = planner()
    feed(p, c2=(0.03, 0.01), c1=(0.03, 0.01), a1=0.5, a0=0.2, a02=0.0)
    assert p.plan_round() == Plan("plain", 0)


def test_short_context_with_a_good_drafter_skips_level1():
    """Level 1 as expensive as level 2 but level 0 accepted by level 2: level 0 drafts for level 2 directly."""
    p = planner()
    feed(p, c2=(0.03, 0.001), c1=(0.03, 0.001), a1=0.9, a0=0.9, a02=0.85)
    plan = p.plan_round()
    assert plan.kind == "level0" and plan.gamma2 >= 4


def test_gamma1_follows_level0_acceptance():
    good, bad = planner(), planner()
    feed(good, a0=1.0)
    feed(bad, a0=0.0, c1=(0.03, 0.02))
    assert good.gamma1() == 3
    assert bad.gamma1() == 0


def test_paused_level0_is_probed_again():
    p = planner()
    feed(p, a0=0.0, c1=(0.03, 0.02))
    choices = [p.gamma1() for _ in range(PROBE_EVERY)]
    assert choices[:-1] == [0] * (PROBE_EVERY - 1) and choices[-1] == 3


def test_unchosen_schedules_are_probed_again():
    p = planner()
    feed(p)
    kinds = [p.plan_round().kind for _ in range(PROBE_EVERY + 1)]
    assert "plain" in kinds and "level0" in kinds and kinds.count("levels") >= PROBE_EVERY - 1


def test_round_rate_matches_the_formula():
    p = planner()
    feed(p, rounds=0)
    p.a1 = Acceptance(prior=0.9, weight=1e9)
    p.observe_refresh(0.016)
    per_token = 1.0 / max(p._level1_rate(g) for g in range(4))
    tokens = expected_tokens(0.9, 4)
    expected = tokens / (p.level2(5) + 4 * per_token + tokens * 0.016 / p.config.refresh_every)
    assert p.rate(Plan("levels", 4)) == pytest.approx(expected)


def test_step_cost_extrapolates_with_a_prior_slope():
    cost = StepCost()
    cost.observe(7, 0.07)
    assert cost(7) == 0.07 and cost(1) == pytest.approx(0.07 * (1 - 0.6))


def test_step_cost_is_never_free():
    """A clock too coarse for a fast step (0 s) or an extrapolation below zero must not make a rate infinite."""
    cost = StepCost()
    cost.observe(1, 0.0)
    assert cost(1) > 0 and cost(5) > 0
    cost = StepCost()
    cost.observe(4, 0.001)
    cost.observe(8, 0.010)
    assert cost(1) > 0  # the affine fit is negative there


def test_zero_second_measurements_do_not_break_the_schedule():
    p = planner()
    for w in range(1, 12):
        p.level2.observe(w, 0.0)
        p.level1.observe(w, 0.0)
        p.level0.observe(w, 0.0)
    p.rounds = 1000
    assert p.gamma1() in range(4) and p.plan_round().kind in ("levels", "level0", "plain")


def test_a_one_time_slow_forward_does_not_stick():
    """The first forwards of a call pay one-time costs; a second normal forward of that width restores the cost."""
    cost = StepCost()
    cost.observe(7, 0.500)  # first level-1 step: buffers allocated
    cost.observe(7, 0.040)
    assert cost(7) == pytest.approx(0.040)
    for _ in range(8):
        cost.observe(7, 0.060)  # the machine got slower: the estimate follows within a few forwards
    assert cost(7) == pytest.approx(0.060)


def test_acceptance_fades_by_tokens_judged_not_by_rounds():
    """A rejection weighs as much after ten one-token rounds as after ten judged tokens of longer rounds."""
    short, long = Acceptance(0.8), Acceptance(0.8)
    for a in (short, long):
        a.observe(6, 0)
    for _ in range(12):
        short.observe(1, 1)
    for _ in range(2):
        long.observe(6, 6)
    assert short.rate == pytest.approx(long.rate, abs=0.02)
    assert long.rate > 0.9  # twelve accepted tokens after one rejection


def test_streak_acceptance_keeps_runs_apart():
    """Rejections, then a run of full acceptances: each state learns its own rate, the estimate follows the last
    verdict."""
    a = StreakAcceptance(0.8)
    for _ in range(10):
        a.observe(4, 0)
    for _ in range(10):
        a.observe(4, 4)
    assert a.after[True].rate > 0.95 and a.after[False].rate < 0.6
    assert a.rate == a.after[True].rate
    a.observe(4, 1)
    assert a.rate == a.after[False].rate and not a.last_full


def _best_levels_gamma(p: Planner) -> int:
    return max(range(1, 7), key=lambda g: p.rate(Plan("levels", g)))


@pytest.mark.parametrize("estimator", ["streak", "one average"])
def test_a_run_of_full_acceptances_after_a_hard_passage_lengthens_the_rounds(estimator):
    """Level 1 rejected at once for a while (a passage the view does not know), then accepted in full round after
    round: conditioned on the previous verdict, the planner is back to the longest rounds within five rounds (1, 1, 2,
    4, 6 drafts); one running average is not (1, 1, 1, 1, 1: each one-token round lifts it by little)."""
    p = planner()
    feed(p, rounds=0)
    if estimator == "one average":
        p.a1 = Acceptance(0.8)
    for _ in range(8):
        p.a1.observe(2, 0)
    gammas = []
    for _ in range(5):
        gammas.append(_best_levels_gamma(p))
        p.a1.observe(gammas[-1], gammas[-1])
    assert gammas[0] < 6
    assert (gammas[-1] == 6) == (estimator == "streak"), gammas
