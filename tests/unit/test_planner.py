"""The adaptive schedule: decisions from measured costs and acceptances (no model; costs are fed in)."""

from __future__ import annotations

import pytest

from hf_triforce import TriForceConfig
from hf_triforce.hierarchy.cost_model import (
    Acceptance,
    ConfidenceAcceptance,
    RunningRate,
    StepCost,
    StreakAcceptance,
    expected_tokens,
)
from hf_triforce.hierarchy.planner import PROBE_EVERY, Plan, Planner
from hf_triforce.hierarchy.tree_shape import PositionalAcceptance

pytestmark = pytest.mark.unit


def planner(drafter=True, one_sequence=False, **config) -> Planner:
    config = TriForceConfig(**{"gamma1": 3, "gamma2": 6, **config})
    return Planner(config, has_drafter=drafter, one_sequence=one_sequence)


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


def test_unchosen_schedules_are_probed_again_where_they_could_win():
    """Level 0 -> 2 is re-tried every PROBE_EVERY rounds where it could win at the better of level 2's and level 1's
    acceptance of level 0's drafts; not where level 1 rejects them too (natural text and n-gram lookup). A plain step
    is never probed: its cost is measured, and it has no acceptance to learn."""
    p = planner()
    feed(p, a0=1.0)
    kinds = [p.plan_round().kind for _ in range(PROBE_EVERY + 1)]
    assert "plain" not in kinds and "level0" in kinds and kinds.count("levels") >= PROBE_EVERY - 1
    p = planner()
    feed(p, a0=0.2, a02=0.2)
    assert [p.plan_round().kind for _ in range(PROBE_EVERY + 1)] == ["levels"] * (PROBE_EVERY + 1)


def test_a_probe_drafts_the_length_the_estimates_favour():
    """Re-trying level 0 -> 2 when level 2 rejected its drafts (level 1 now accepts them): a one-token probe (a failed
    long one costs a wide verification for one token); with nothing measured yet, the longest."""
    p = planner()
    assert p.plan_round() == Plan("levels", 6) and p.plan_round() == Plan("level0", 9)
    p = planner()
    feed(p, a0=1.0, a02=0.0)
    p.last_tried["level0"] = p.rounds - PROBE_EVERY
    probe = p.plan_round()
    assert probe == Plan("level0", 1)
    assert probe == max((Plan("level0", g) for g in range(1, 10)), key=p.rate)


def test_a_level_kept_out_of_the_schedule_is_judged_again_by_its_usual_rate():
    """Level 1 usually accepts 95%, then two rejections in a row: the state after a rejection puts it below the
    other schedules. Rounds without level 1 do not update that state, so what it says fades with the tokens they
    decide, toward level 1's call-long rate, and level 1 is back in the schedule within a few tokens (it was out
    until the next probe, PROBE_EVERY rounds later)."""
    p = planner()
    feed(p, a1=0.95, a02=0.35)
    for _ in range(2):
        p.a1.observe(6, 0)
    out = p.plan_round()
    assert out.kind != "levels"
    back = None
    for round_ in range(PROBE_EVERY):
        p.observe_level2(out, out.gamma2, 0, 0.1)  # each decides one token
        out = p.plan_round()
        if out.kind == "levels":
            back = round_ + 1
            break
    assert back is not None and back <= 6, back
    assert p.a1.overall.rate > 0.85 and p.a1.after[False].rate < 0.6


def test_round_rate_matches_the_formula():
    p = planner()
    feed(p, rounds=0)
    p.a1 = Acceptance(prior=0.9, weight=1e9)
    p.observe_refresh(0.016)
    per_token = 1.0 / max(p._level1_rate(g) for g in range(4))
    tokens = expected_tokens(0.9, 4)  # 4.1 tokens: every round is due a re-selection (refresh_every=4)
    expected = tokens / (p.level2(5) + 4 * per_token + 0.016)
    assert p.rate(Plan("levels", 4)) == pytest.approx(expected)
    tokens = expected_tokens(0.9, 1)  # 1.9 tokens: a re-selection every 4 / 1.9 rounds
    expected = tokens / (p.level2(2) + per_token + 0.016 * tokens / 4)
    assert p.rate(Plan("levels", 1)) == pytest.approx(expected)


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


# -- rounds that stop by level 1's confidence -------------------------------------------------------------------


def test_confidence_stops_let_levels_rounds_run_to_gamma2():
    """With confidence stops a "levels" round may draft up to gamma2 (keep_drafting ends it); without, the plan's
    length is the round's, and a fixed schedule never stops by confidence."""
    free, planned = planner(drafter=False, one_sequence=True), planner(drafter=False)
    for p in (free, planned):
        feed(p, a1=0.7)  # acceptance so low that the planned rounds are short
    assert free.plan_round() == Plan("levels", 6)
    assert planned.plan_round().gamma2 < 6 and planned.keep_drafting(1, survival=0.0)
    fixed = planner(one_sequence=True, adaptive=False)
    assert not fixed.confidence_stops and fixed.keep_drafting(1, survival=0.0)


def test_keep_drafting_weighs_one_more_token_against_the_reached_rate():
    """One more token is worth survival * a1 tokens for a level-1 step plus one verified position; it is drafted
    while that beats the tokens per second the call has reached."""
    p = planner(one_sequence=True)
    assert p.keep_drafting(3, survival=0.01)  # nothing measured: draft on
    feed(p, a1=0.9)
    assert p.keep_drafting(3, survival=0.01)  # no round counted yet
    p.reached.observe(tokens=5, seconds=0.25)  # 20 tokens per modeled second
    marginal = p._level1_seconds_per_token() + p.level2.slope()
    threshold = 20.0 * marginal / p.a1.rate  # the survival at which one more token breaks even
    assert p.keep_drafting(3, survival=min(1.0, threshold * 1.05))
    assert not p.keep_drafting(3, survival=threshold * 0.95)
    slow = planner(one_sequence=True)
    feed(slow, a1=0.9)
    slow.reached.observe(tokens=5, seconds=1.0)  # a call reaching 5 tokens/s drafts on at lower survival
    assert slow.keep_drafting(3, survival=threshold * 0.95)


def test_a_round_counts_at_its_modeled_seconds_not_its_clock():
    """After the opening, the rate the decisions weigh is tokens per modeled second: the round's steps at the fixed
    costs. Its wall clock goes to the explanation only, so a round slowed by the machine changes no decision."""
    p = planner(one_sequence=True)
    feed(p, c2=(0.10, 0.0), c1=(0.02, 0.0))
    p.costs.fix()
    for _ in range(3):  # one level-1 step and a verification, whatever the clock says
        p.observe_level1(0, 0, seconds=5.0)
        p.observe_level2(Plan("levels", 1), 1, 1, seconds=7.0)
        p.observe_round(tokens=2, seconds=12.0 if _ else 0.1)
    assert p.reached.rate == pytest.approx(2 / 0.12)
    assert p.level2(2) == pytest.approx(0.10) and p.level1(1) == pytest.approx(0.02)  # fixed: nothing re-timed


def test_the_planner_learns_acceptance_by_confidence():
    """Verdicts of a levels round update the buckets of its drafts' confidences: accepted ones, then the rejected
    one; drafts after the rejection were never judged."""
    p = planner(one_sequence=True)
    before = [p.token_acceptance(c) for c in (0.3, 0.9, 0.999)]
    for _ in range(10):
        p.observe_level2(Plan("levels", 6), drafted=3, accepted=1, seconds=0.1, confidences=[0.999, 0.3, 0.9])
    after = [p.token_acceptance(c) for c in (0.3, 0.9, 0.999)]
    assert after[0] < 0.1 < before[0]  # the rejected, unsure token
    assert after[1] == before[1]  # never judged
    assert after[2] > before[2]  # accepted each time
    p.observe_level2(Plan("level0", 6), drafted=3, accepted=0, seconds=0.1, confidences=[0.999])  # not level 1's
    assert p.token_acceptance(0.999) == after[2]


def test_a_level0_proposal_short_of_the_round_counts_as_a_rejection_at_its_end():
    """A level 0 -> 2 round asked for 6 drafts: an n-gram that proposed 2 (both accepted) or none yielded what a
    rejection after them yields, and level 2's estimate of level 0 counts it so; a whole proposal accepted does not."""
    short, whole, unknown = planner(), planner(), planner()
    for _ in range(6):
        short.observe_level2(Plan("level0", 6), drafted=2, accepted=2, seconds=None, requested=6)
        short.observe_level2(Plan("level0", 6), drafted=0, accepted=0, seconds=None, requested=6)
        whole.observe_level2(Plan("level0", 6), drafted=6, accepted=6, seconds=None, requested=6)
        unknown.observe_level2(Plan("level0", 6), drafted=2, accepted=2, seconds=None)  # nothing asked: as drafted
    assert short.a02.overall.failures > 5.0 and unknown.a02.overall.failures < 1.0  # the prior's, faded
    assert short.a02.overall.rate < 0.6 < 0.9 < whole.a02.overall.rate
    short.observe_level2(Plan("levels", 6), drafted=2, accepted=2, seconds=None, requested=6)  # level 1's: its own
    assert short.a1.after[True].verdicts == 1 and short.a1.after[True].failures < 1.0


def test_confidence_acceptance_keeps_buckets_apart():
    a = ConfidenceAcceptance()
    for _ in range(20):
        a.observe([0.995, 0.995, 0.2], accepted=2)
    assert a.rate(0.999) > 0.99 and a.rate(0.1) < 0.1 and a.rate(0.9) == pytest.approx(0.9)


def test_running_rate_follows_the_latest_rounds():
    rate = RunningRate()
    for _ in range(30):
        rate.observe(tokens=5, seconds=0.5)  # 10 tokens/s
    for _ in range(30):
        rate.observe(tokens=5, seconds=0.25)  # 20 tokens/s
    assert rate.rate == pytest.approx(20.0, rel=0.01)


def test_step_cost_slope():
    cost = StepCost()
    assert cost.slope() is None
    cost.observe(3, 0.10)
    assert cost.slope() == pytest.approx(0.01)  # the prior: 10% of the one measured width's cost
    for w in range(1, 8):
        cost.observe(w, 0.08 + 0.01 * w + (0.004 if w % 2 else -0.004))  # noisy around 10 ms a token
    assert cost.slope() == pytest.approx(0.01, abs=0.002)
    cost = StepCost()
    cost.observe(2, 0.10)
    cost.observe(5, 0.09)  # a wider forward measured faster: no negative cost for a token
    assert cost.slope() == 0.0


def test_a_verification_that_streams_the_cache_lengthens_the_rounds():
    """``offload_kv``: a verification also pays a pass of the cache over the bus, a fixed cost the planner measures
    in the level-2 forward's time (its intercept). With it the best level-1 round is the longest ``gamma2`` allows;
    with the cache on the device (the same acceptance, a level-2 step only 1.5x a level-1 step) a shorter one."""
    on_device, offloaded = planner(gamma2=16), planner(gamma2=16)
    feed(on_device, c2=(0.045, 0.004), c1=(0.03, 0.004), a1=0.8)
    feed(offloaded, c2=(2.75, 0.004), c1=(0.03, 0.004), a1=0.8)
    assert offloaded.plan_round() == Plan("levels", 16)
    assert on_device.plan_round().gamma2 < 16


# -- token trees (TriForceConfig.tree_budget) -----------------------------------------------------------------------


def _tree_planner(level2: dict[int, float], level1: dict[int, float], **config) -> Planner:
    planner = Planner(TriForceConfig(gamma2=6, **config), has_drafter=False, one_sequence=True, trees=True)
    for width, seconds in level2.items():
        planner.level2.observe(width, seconds)
    for width, seconds in level1.items():
        planner.level1.observe(width, seconds)
    for _ in range(40):  # a greedy call's chains: level 1's first choice right 85% of the time, its second 8%
        planner.positional.observe(8, 0)
    for rank in [1] * 4 + [2] * 2 + [-1] * 2:
        planner.positional.observe(8, rank)
    return planner


def test_auto_keeps_chains_where_a_verification_s_cost_grows_with_its_width():
    """This CPU at 7K (benchmarks/experiments/verification_width.py): 75 ms for 1 token, 112 for 8, 3.6 ms a token
    more; level 1 15 ms a step. A 16-node tree yields more tokens than a 7-token chain but costs more than it gains."""
    cpu = _tree_planner({1: 0.075, 7: 0.105, 8: 0.112}, {1: 0.015, 2: 0.017, 3: 0.019}, adaptive=True)
    assert cpu.tree_for(Plan("levels", 6)) is None


def test_auto_drafts_wide_trees_where_width_is_nearly_free():
    """A GPU at long context: a verification of 64 tokens costs about what one of 1 does (the cache read dominates)."""
    gpu = _tree_planner({1: 0.043, 7: 0.0432, 8: 0.0433}, {1: 0.005, 2: 0.0051, 3: 0.0052}, adaptive=True)
    tree = gpu.tree_for(Plan("levels", 6))
    assert tree is not None and tree.size >= 16 and not tree.is_chain()
    assert gpu.tree_rate(tree) > 1.1 * gpu.rate(Plan("levels", 6))


def test_auto_waits_for_measured_widths_and_a_fixed_schedule_drafts_chains():
    assert _tree_planner({1: 0.04}, {1: 0.005}, adaptive=True).tree_for(Plan("levels", 6)) is None
    flat = _tree_planner({1: 0.043, 8: 0.0433}, {1: 0.005, 2: 0.0051}, adaptive=False)
    assert flat.tree_for(Plan("levels", 6)) is None
    assert _tree_planner({}, {}, adaptive=False, tree_budget=12).tree_for(Plan("levels", 6)).size <= 12


def test_a_node_count_builds_sequoia_s_tree_for_the_measured_vector():
    planner = _tree_planner({}, {}, tree_budget=16)
    tree = planner.tree_for(Plan("levels", 6))
    assert tree.size == 16 and tree.depth <= 6 and not tree.is_chain()
    assert Planner(TriForceConfig(tree_budget=16), has_drafter=False, trees=False).tree_for(Plan("levels", 6)) is None


def test_a_tree_wider_than_the_room_left_is_drafted_as_a_chain():
    """The full cache reserves one chain round past ``max_length``: a tree with more nodes than its free slots is
    planned as the chain instead (the storage never grows)."""
    planner = _tree_planner({}, {}, adaptive=False, tree_budget=16)
    assert planner.plan_round(room=16).tree.size == 16
    assert planner.plan_round(room=15) == Plan("levels", 6)
    assert planner.plan_round().tree.size == 16  # no room given: one unbounded cache


def test_greedy_rounds_measure_unconditional_rank_rates():
    """A greedy round that accepted all its drafts still counts each node as a trial for every rank: otherwise the
    rate of rank 2 is measured over the rounds that missed only, and a tree over-builds its second branches."""
    planner = _tree_planner({}, {})
    planner.positional = PositionalAcceptance(prior_first=0.8, weight=0.0)
    for _ in range(3):
        planner.observe_level2(Plan("levels", 6), 6, 6, 0.1, rank=0)  # 18 nodes accepted, no miss
    planner.observe_level2(Plan("levels", 6), 6, 1, 0.1, rank=1)  # 1 accepted, the miss caught by rank 2
    counts = planner.positional.to_dict()
    assert counts["trials"][:2] == [20.0, 20.0] and counts["accepted"][:2] == [19.0, 1.0]
    assert planner.positional.vector(2) == pytest.approx([0.95, 0.05])


@pytest.mark.parametrize("trees_pay", [True, False])
def test_auto_keeps_trees_only_while_their_rounds_are_measured_faster(trees_pay):
    """The model prices a tree's wide forwards by extrapolating narrower ones and its tokens from the positional
    acceptance; the rounds' tokens per modeled second (their steps at the fixed costs, never their clock) decide.
    Where tree rounds give fewer than chain rounds, 'auto' drafts chains and re-tries a tree every PROBE_EVERY
    rounds; where they give more, it keeps drafting trees."""
    gpu = _tree_planner({1: 0.043, 7: 0.0432, 8: 0.0433}, {1: 0.005, 2: 0.0051, 3: 0.0052}, adaptive=True)
    gpu.costs.fix()
    shapes = []
    for _ in range(3 * PROBE_EVERY):
        plan = gpu.plan_round()
        shapes.append(plan.tree is not None)
        gpu.step(gpu.level2, plan.tree.size if plan.tree is not None else plan.gamma2 + 1, seconds=9.9)
        tree_tokens = 8 if trees_pay else 2
        gpu.observe_round(tree_tokens if plan.tree is not None else 5, 0.1)
    if trees_pay:
        assert sum(shapes) >= 2 * PROBE_EVERY
    else:
        assert 2 <= sum(shapes) <= 5  # the first tree, then one re-try per PROBE_EVERY rounds
