"""The planner's choice and its explanation in four regimes, driven as the decoding loop drives it (no model).

Each regime is a set of injected step costs (seconds of a level-2 and a level-1 forward by width, of a level-0
proposal) and per-token acceptances. :func:`simulate` first times the steps the way a call's calibration does (the
widths :mod:`hf_triforce.hierarchy.calibration` names, then fixed), then runs rounds through the planner's public API
the way ``Level1Drafter`` does (``plan_round``, ``gamma1``, ``observe_level0/level1/level2``,
``observe_tree_step/tree``, ``observe_round``), drawing each verdict from a seeded generator, so the planner learns
the regime's acceptances from its verdicts and its costs from the calibration only. The tests then check the
schedule it settled on and what :meth:`Planner.explain` says about it.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hf_triforce import TriForceConfig, TriForceStats
from hf_triforce.hierarchy.calibration import level0_drafts, level1_widths, level2_widths, tree_verification_widths
from hf_triforce.hierarchy.cost_model import expected_tokens
from hf_triforce.hierarchy.planner import PROBE_EVERY, SCHEDULE_MARGIN, TREE_MARGIN, Plan, Planner, tree_widths
from hf_triforce.hierarchy.tree_shape import MAX_BRANCH

pytestmark = pytest.mark.unit

MS = 1e-3


def affine(first_ms: float, per_token_ms: float) -> Callable[[int], float]:
    """Seconds of a forward of ``w`` query tokens: ``first_ms`` for one token, ``per_token_ms`` each one more."""
    return lambda width: (first_ms + per_token_ms * (width - 1)) * MS


@dataclass(frozen=True)
class Regime:
    """Injected costs and acceptances. ``ranks``: the chance that level 1's k-th candidate is level 2's token
    (``ranks[0]`` is the per-token acceptance ``a1`` of a chain)."""

    level2: Callable[[int], float]
    level1: Callable[[int], float]
    level0_ms: float
    ranks: tuple[float, ...]
    a0: float
    a02: float
    context: int


def _accepted(rng: random.Random, drafted: int, acceptance: float) -> int:
    """The accepted prefix of ``drafted`` tokens, each accepted with ``acceptance`` while the previous ones were."""
    accepted = 0
    while accepted < drafted and rng.random() < acceptance:
        accepted += 1
    return accepted


def _rank(rng: random.Random, ranks: tuple[float, ...], children: int) -> int:
    """The 0-based rank of level 2's token among ``children`` candidates (``-1``: none of them)."""
    u, total = rng.random(), 0.0
    for k, p in enumerate(ranks[:children]):
        total += p
        if u < total:
            return k
    return -1


def _levels_round(p: Planner, regime: Regime, plan: Plan, rng: random.Random) -> tuple[int, float]:
    """A chain of level-1 drafts, each level-1 step verifying ``gamma1()`` level-0 drafts, then its verification."""
    seconds, drafted = 0.0, 0
    while drafted < plan.gamma2:
        k = min(p.gamma1(), plan.gamma2 - drafted - 1)
        if k > 0:
            p.observe_level0(k, regime.level0_ms * MS)
            seconds += regime.level0_ms * MS
        kept = _accepted(rng, k, regime.a0)
        step = regime.level1(k + 1)
        p.observe_level1(k, kept, step)
        seconds += step
        drafted += kept + 1
    drafted = min(drafted, plan.gamma2)
    accepted = _accepted(rng, drafted, regime.ranks[0])
    rank = None if accepted == drafted else _rank(rng, (0.0, *regime.ranks[1:]), MAX_BRANCH)
    verify = regime.level2(drafted + 1)
    p.observe_level2(plan, drafted, accepted, verify, rank=None if rank is None else (rank if rank >= 0 else 99))
    return accepted + 1, seconds + verify


def _tree_round(p: Planner, regime: Regime, plan: Plan, rng: random.Random) -> tuple[int, float]:
    """A token tree: one level-1 forward per depth, then one verification; level 2 walks down from the root."""
    shape, seconds = plan.tree, 0.0
    for width in tree_widths(shape):
        p.observe_tree_step(width, regime.level1(width))
        seconds += regime.level1(width)
    children, node, ranks, counts = shape.children, 0, [], []
    while children[node]:
        rank = _rank(rng, regime.ranks, len(children[node]))
        ranks.append(rank)
        counts.append(len(children[node]))
        if rank < 0:
            break
        node = children[node][rank]
    verify = regime.level2(shape.size)
    p.observe_tree(ranks, counts, verify, shape.size)
    return sum(rank >= 0 for rank in ranks) + 1, seconds + verify


def calibrate(p: Planner, regime: Regime) -> None:
    """Time the regime's steps at the widths a call's calibration times, then fix the costs."""
    config = p.config
    for width in level2_widths(config, p.has_drafter):
        p.costs.level2.observe(width, regime.level2(width))
    for width in tree_verification_widths(p.costs) if p.trees and config.tree_budget == "auto" else []:
        p.costs.level2.observe(width, regime.level2(width))
    for width in level1_widths(config, p.has_drafter, p.trees):
        p.costs.level1.observe(width, regime.level1(width))
    for k in level0_drafts(config):
        p.costs.level0.observe(k, regime.level0_ms * MS)
    p.costs.fix()


def _margined(kind: str, weighed: dict) -> float:
    """A schedule's modeled rate as the planner compares it: another than levels must win by SCHEDULE_MARGIN."""
    return weighed[kind].rate / (1.0 if kind == "levels" else SCHEDULE_MARGIN)


def simulate(p: Planner, regime: Regime, rounds: int = 300, seed: int = 0) -> list[Plan]:
    """Calibrate ``p`` on ``regime``, then run ``rounds`` rounds of it through ``p``; returns the plans of the rounds
    that were decisions (not probes). At every decision the explanation must agree with the choice: the chosen
    schedule modeled fastest."""
    calibrate(p, regime)
    rng, decided = random.Random(seed), []
    for _ in range(rounds):
        decisions = p.record.decisions
        plan = p.plan_round()
        if p.record.decisions > decisions:
            weighed = p.record.weighed
            assert _margined(p.record.decided, weighed) == max(_margined(kind, weighed) for kind in weighed)
            decided.append(plan)
        if plan.kind == "plain":
            tokens, seconds = 1, regime.level2(1)
            p.observe_level2(plan, 0, 0, seconds)
        elif plan.kind == "level0":
            draft = regime.level0_ms * MS
            p.observe_level0(plan.gamma2, draft)
            accepted = _accepted(rng, plan.gamma2, regime.a02)
            verify = regime.level2(plan.gamma2 + 1)
            p.observe_level2(plan, plan.gamma2, accepted, verify)
            tokens, seconds = accepted + 1, draft + verify
        elif plan.tree is not None:
            tokens, seconds = _tree_round(p, regime, plan, rng)
        else:
            tokens, seconds = _levels_round(p, regime, plan, rng)
        p.observe_round(tokens, seconds)
    return decided


def _planner(drafter: bool = True, trees: bool = False, **config) -> Planner:
    return Planner(TriForceConfig(**{"gamma1": 2, "gamma2": 8, **config}), has_drafter=drafter, trees=trees)


def _explained(p: Planner, regime: Regime) -> dict:
    """The explanation, checked for what holds in every regime: JSON round trip, the chosen schedule modeled
    fastest, the reason naming it first with the context, a summary of two lines."""
    e = p.explain(context_tokens=regime.context)
    assert json.loads(json.dumps(e)) == e
    schedules = e["schedules"]
    assert set(schedules) == ({"levels", "level0", "plain"} if p.has_drafter else {"levels", "plain"})
    modeled = {kind: s["modeled_ms_per_token"] for kind, s in schedules.items()}
    margined = {kind: m * (1 if kind == "levels" else SCHEDULE_MARGIN) for kind, m in modeled.items() if m is not None}
    assert margined[e["chosen"]] == min(margined.values()), e
    assert e["reason"].startswith(e["chosen"]) and f"at {regime.context} tokens of context" in e["reason"]
    assert sum(s["rounds"] for s in schedules.values()) == e["rounds"] == p.rounds
    assert e["decisions"] + e["probes"] == p.rounds
    summary = TriForceStats(planner=e).schedule_summary
    assert summary.count("\n") == 1 and summary.endswith(e["reason"])
    return e


def _levels_seldom(e: dict, decided: list[Plan]) -> bool:
    """The levels schedule ran about as a probe only: one round per PROBE_EVERY, the first, and under 3% of the
    decisions (when a run of full acceptances made it model fastest, which :func:`simulate` checks at each one)."""
    chosen = sum(plan.kind == "levels" for plan in decided)
    return (
        chosen <= 0.03 * len(decided) and e["schedules"]["levels"]["rounds"] <= e["rounds"] // PROBE_EVERY + 1 + chosen
    )


# -- short context: level 1's view is about the whole cache, so a level-1 step costs about a plain step --------------

SHORT = dict(level2=affine(30.0, 4.0), level1=affine(27.0, 4.0), level0_ms=0.2, ranks=(0.9,), context=1024)


def test_short_context_decodes_plainly_when_the_drafter_misses():
    """A CPU at 1K: a plain step 30 ms, a level-1 step as costly (the view is nearly the cache), n-gram drafts that
    miss. Levels model slower than plain steps by more than the schedule margin, so they run only as probes; plain is
    chosen, and its measured cost per token is exactly the injected step's."""
    p, regime = _planner(), Regime(**{**SHORT, "level1": affine(30.0, 4.0)}, a0=0.05, a02=0.05)
    decided = simulate(p, regime)
    e = _explained(p, regime)
    assert e["chosen"] == "plain" and sum(plan.kind == "plain" for plan in decided[-50:]) >= 45
    assert sum(plan.kind == "plain" for plan in decided) >= 0.5 * len(decided)  # once the priors fade
    levels, plain = e["schedules"]["levels"], e["schedules"]["plain"]
    assert levels["modeled_ms_per_token"] > SCHEDULE_MARGIN * plain["modeled_ms_per_token"]
    assert plain["modeled_ms_per_token"] == pytest.approx(30.0) == plain["measured_ms_per_token"]
    assert e["reason"].startswith("plain: modeled 30 ms/token vs levels ")


def test_a_schedule_within_the_margin_of_levels_does_not_displace_it():
    """The same with a level-1 step of 27 ms: plain models only a few percent faster (within SCHEDULE_MARGIN), so the
    levels schedule keeps running, at most the margin slower than plain steps would be (a switch on estimates that
    close would pay for their noise)."""
    p, regime = _planner(), Regime(**SHORT, a0=0.05, a02=0.05)
    decided = simulate(p, regime)
    e = _explained(p, regime)
    levels, plain = e["schedules"]["levels"], e["schedules"]["plain"]
    assert e["chosen"] == "levels" and sum(plan.kind == "levels" for plan in decided[-50:]) >= 45
    assert plain["modeled_ms_per_token"] < levels["modeled_ms_per_token"] < SCHEDULE_MARGIN * 30.0
    assert levels["measured_ms_per_token"] < SCHEDULE_MARGIN * 30.0


def test_short_context_with_a_cheap_accepted_drafter_skips_level1():
    """The same costs with level-0 drafts level 2 accepts 85% of the time at 0.2 ms each: level 0 -> 2, long drafts
    (a verification of 10 costs 66 ms, ten plain steps 300); never levels, which model slower."""
    p, regime = _planner(), Regime(**SHORT, a0=0.85, a02=0.85)
    decided = simulate(p, regime)
    e = _explained(p, regime)
    assert e["chosen"] == "level0" and _levels_seldom(e, decided)
    assert statistics.median(plan.gamma2 for plan in decided if plan.kind == "level0") >= 4
    level0 = e["schedules"]["level0"]
    assert level0["modeled_ms_per_token"] < e["schedules"]["levels"]["modeled_ms_per_token"]
    assert level0["modeled_ms_per_token"] < 0.7 * e["schedules"]["plain"]["modeled_ms_per_token"]
    assert 0.6 < level0["acceptance"] <= 1.0 and level0["expected_tokens"] > 2.0


# -- long context: a level-1 step over the view is much cheaper than a step over the full cache ----------------------


def test_long_context_speculates_through_level1():
    """A CPU at 7K: a verification 75 ms plus 3.6 ms a token, a level-1 step 15 ms plus 2 ms, level 1 accepted 85%,
    a drafter that misses: levels, modeled and measured well under a plain step's 75 ms a token (modeled at the
    acceptance the latest verdict calls for, so the two differ by up to a quarter)."""
    regime = Regime(affine(75.0, 3.6), affine(15.0, 2.0), 0.2, (0.85,), a0=0.05, a02=0.05, context=7168)
    p = _planner()
    decided = simulate(p, regime)
    e = _explained(p, regime)
    levels = e["schedules"]["levels"]
    assert e["chosen"] == "levels" and sum(plan.kind == "levels" for plan in decided[-50:]) >= 45
    assert levels["gamma2"] == decided[-1].gamma2
    assert levels["shape"] == "chain" and levels["gamma1"] == 0  # the drafter is not worth a level-1 step's width
    assert levels["modeled_ms_per_token"] < 0.75 * 75.0 and levels["measured_ms_per_token"] < 0.65 * 75.0
    # the record's model is priced at the latest streak's acceptance; at the call-long one it is what was measured
    g, overall = levels["gamma2"], p.a1.overall.rate
    round_seconds = p.level2(g + 1) + g * p._level1_seconds_per_token()
    modeled = 1e3 * round_seconds / expected_tokens(overall, g)
    assert levels["measured_ms_per_token"] == pytest.approx(modeled, rel=0.25)
    assert e["reason"].startswith(f"levels (gamma2 {levels['gamma2']}, chain): modeled ")


# -- cheap verification (a GPU at long context: a verification's width is nearly free) -------------------------------

GPU = dict(level2=affine(43.0, 0.01), level1=affine(5.0, 0.01), level0_ms=0.2, a0=0.05, a02=0.05, context=131072)


def test_cheap_verification_drafts_long_chains():
    """A (gamma2 + 1)-token verification costs about a plain step (43 ms), a level-1 step 5 ms, level 1 accepted
    90%: levels with rounds at or near gamma2 (8), longer than the CPU's at the same acceptance, where each verified
    token costs 3.6 ms."""
    gpu, cpu = _planner(), _planner()
    gpu_decided = simulate(gpu, Regime(**GPU, ranks=(0.9,)))
    cpu_regime = Regime(affine(75.0, 3.6), affine(15.0, 2.0), 0.2, (0.9,), a0=0.05, a02=0.05, context=7168)
    cpu_decided = simulate(cpu, cpu_regime)
    e = _explained(gpu, Regime(**GPU, ranks=(0.9,)))
    assert e["chosen"] == "levels" and e["schedules"]["levels"]["gamma2"] == gpu_decided[-1].gamma2
    gpu_lengths = [plan.gamma2 for plan in gpu_decided if plan.kind == "levels"]
    cpu_lengths = [plan.gamma2 for plan in cpu_decided if plan.kind == "levels"]
    assert statistics.median(gpu_lengths) >= 7
    assert statistics.median(gpu_lengths) > statistics.median(cpu_lengths)
    assert e["schedules"]["levels"]["modeled_ms_per_token"] < 0.5 * e["schedules"]["plain"]["modeled_ms_per_token"]


def _trees_explained(e: dict) -> dict:
    """The record of 'auto''s latest weighing, checked against itself: every size weighed, the chosen one modeled
    fastest and over TREE_MARGIN faster than the chain, or a reason for the chain."""
    trees = e["trees"]
    assert trees["sizes"] == [8, 16, 32, 64] and len(trees["modeled_ms_per_token"]) == 4
    if trees["chosen"] is None:
        assert trees["reason"].startswith(("no tree models", "tree rounds measured slower"))
        assert e["schedules"]["levels"]["shape"] == "chain"
    else:
        tree_ms = trees["modeled_ms_per_token"][trees["sizes"].index(trees["chosen"])]
        assert tree_ms == min(trees["modeled_ms_per_token"])
        assert tree_ms * TREE_MARGIN < trees["chain_modeled_ms_per_token"]
        assert trees["reason"].startswith(f"the {trees['chosen']}-node tree models over")
        assert e["schedules"]["levels"]["shape"] == f"tree:{trees['chosen']}"
    return trees


def test_cheap_verification_with_auto_trees_drafts_trees_modeled_faster_by_the_margin():
    """The same costs, ``tree_budget='auto'``, level 1's first candidate right 50% of the time and its second and
    third 25% and 10% (branches pay): trees wherever they model faster than the chain by TREE_MARGIN, and tree rounds
    measured faster than chain rounds. After a run of rejections the record shows the tree drafted."""
    regime = Regime(**GPU, ranks=(0.5, 0.25, 0.1))
    p = _planner(drafter=False, trees=True, tree_budget="auto", gamma2=6)
    decided = simulate(p, regime)
    trees = _trees_explained(_explained(p, regime))
    sizes = [plan.tree.size for plan in decided if plan.tree is not None]
    assert len(sizes) > 0.15 * len(decided)
    assert trees["measured_ms_per_token"]["tree"] < trees["measured_ms_per_token"]["chain"]
    for _ in range(5):
        p.a1.observe(6, 1)  # rejections: the chain's acceptance falls
    p.rounds, p._chain_tried = p._tree_tried + 1, p._tree_tried  # neither shape is due a re-try
    plan = p.plan_round()
    trees = _trees_explained(p.explain(regime.context))
    assert plan.tree is not None and trees["chosen"] == plan.tree.size


def test_auto_trees_stay_chains_where_the_first_candidate_is_nearly_always_right():
    """Cheap verification, but level 1's first candidate right 96% of the time (what level 1 measured at 7K tokens on
    the CPU): a tree wins only by its branches, and a chain priced at the same acceptance is as deep, so 'auto'
    drafts chains (a tree at most after a run of rejections, when its branches model the margin; none before level
    1's ranks are judged) and says no tree models the margin."""
    p = _planner(drafter=False, trees=True, tree_budget="auto", gamma2=6)
    decided = simulate(p, Regime(**GPU, ranks=(0.96, 0.04)))
    trees = _trees_explained(_explained(p, Regime(**GPU, ranks=(0.96, 0.04))))
    assert sum(plan.tree is not None for plan in decided) <= 0.02 * len(decided)
    assert all(plan.tree is None for plan in decided[:PROBE_EVERY])
    assert trees["reason"].startswith("no tree models")


def test_auto_trees_pay_where_a_wide_verification_is_free_and_branches_catch_misses():
    """Width nearly free (measured at 16 and 64 tokens by the calibration), level 1's first candidate right 85% and
    its next two 8% and 3%: the branches turn misses into accepted tokens at no cost, and where 'auto' drafts trees
    their rounds give more tokens per second than the chain's (the regime's own seconds, not the model's)."""
    regime = Regime(**GPU, ranks=(0.85, 0.08, 0.03))
    for seed in range(3):
        p = _planner(drafter=False, trees=True, tree_budget="auto", gamma2=6)
        decided = simulate(p, regime, seed=seed)
        measured = _trees_explained(_explained(p, regime))["measured_ms_per_token"]
        if any(plan.tree is not None for plan in decided):
            assert measured["tree"] < measured["chain"]


def test_auto_trees_stay_chains_where_width_costs():
    """A CPU where each verified token adds 10 ms to a 75 ms verification, with the same acceptance: 'auto' weighs
    the trees and keeps the chain (an 8-node tree now and then, after a rejection), and says so."""
    regime = Regime(affine(75.0, 10.0), affine(15.0, 2.0), 0.2, (0.85, 0.08, 0.03), a0=0.05, a02=0.05, context=7168)
    p = _planner(drafter=False, trees=True, tree_budget="auto", gamma2=6)
    decided = simulate(p, regime)
    _trees_explained(_explained(p, regime))
    assert sum(plan.tree is not None for plan in decided) <= 0.1 * len(decided)
    for _ in range(3):
        p.a1.observe(6, 6)  # fully accepted rounds: the chain at its best
    plan = p.plan_round()
    trees = _trees_explained(p.explain(regime.context))
    assert plan.tree is None and trees["chosen"] is None and trees["reason"].startswith("no tree models")


# -- streamed verification (offload_kv: each verification pays a pass of the cache over the bus) ---------------------


def test_streamed_verification_drafts_the_longest_rounds():
    """A verification of 2.75 s (the cache streamed from host memory) against level-1 steps of 20 ms on the device,
    level 1 accepted 90%: levels at the longest gamma2 allowed (16), each token a fraction of a plain step."""
    regime = Regime(affine(2750.0, 4.0), affine(20.0, 4.0), 0.2, (0.9,), a0=0.05, a02=0.05, context=131072)
    p = _planner(gamma2=16)
    decided = simulate(p, regime, rounds=200)
    e = _explained(p, regime)
    levels = e["schedules"]["levels"]
    assert e["chosen"] == "levels" and statistics.median(plan.gamma2 for plan in decided) == 16
    assert levels["gamma2"] == decided[-1].gamma2 and levels["measured_tokens_per_round"] > 4.0
    assert levels["measured_ms_per_token"] < 0.25 * e["schedules"]["plain"]["modeled_ms_per_token"]


# -- the record itself ------------------------------------------------------------------------------------------------


def test_a_fixed_schedule_explains_itself_priced_at_the_end():
    """``adaptive=False``: every round levels at gamma2; the reason says it is fixed, the figures are priced when the
    call ends (what the adaptive planner would have weighed)."""
    regime = Regime(**SHORT, a0=0.05, a02=0.05)
    p = _planner(adaptive=False)
    simulate(p, regime, rounds=40)
    e = p.explain(context_tokens=regime.context)
    assert e["chosen"] == "levels" and e["decisions"] == e["probes"] == e["switches"] == 0
    assert e["schedules"]["levels"]["rounds"] == 40 and e["schedules"]["levels"]["gamma2"] == 8
    assert e["modeled_at_round"] == 40 and e["reason"].startswith("fixed schedule (adaptive=False): levels (gamma2 8")


def test_the_record_does_not_grow_with_the_call():
    regime = Regime(**SHORT, a0=0.85, a02=0.85)
    sizes = []
    for rounds in (50, 500):
        p = _planner()
        simulate(p, regime, rounds=rounds)
        sizes.append(len(json.dumps(p.explain(regime.context))))
    assert abs(sizes[1] - sizes[0]) < 40  # digits of the counts only


def test_switches_count_changed_decisions():
    """Long context, then the view stops helping (level 1's drafts rejected; the step costs, measured once, stay): the
    planner switches from levels to another schedule; the record counts every change between consecutive
    decisions."""
    p = _planner()
    decided = simulate(p, Regime(affine(75.0, 3.6), affine(15.0, 2.0), 0.2, (0.85,), a0=0.05, a02=0.05, context=1), 100)
    assert p.explain()["chosen"] == "levels"
    decided += simulate(p, Regime(affine(75.0, 3.6), affine(15.0, 2.0), 0.2, (0.0,), a0=0.05, a02=0.05, context=1), 100)
    e = p.explain()
    changes = sum(a.kind != b.kind for a, b in zip(decided, decided[1:], strict=False))
    assert e["chosen"] != "levels" and e["switches"] == changes >= 1 and e["context_tokens"] is None
    assert " at " not in e["reason"]


def _noisy(cost: Callable[[int], float], seed: int) -> Callable[[int], float]:
    """``cost`` with a +-20% jitter per width seeded by ``seed``, as timings on a busy CPU jitter."""
    return lambda width: cost(width) * random.Random(seed * 1000 + width).uniform(0.8, 1.2)


def _every_plan(budget: int | str, ranks: tuple[float, ...], seed: int) -> list[Plan]:
    """Every round's plan (probes included) of a planner with ``tree_budget=budget`` over the 7K CPU regime,
    whose step costs jitter by width, seeded by ``seed``."""
    regime = Regime(_noisy(affine(75.0, 3.6), seed), _noisy(affine(15.0, 2.0), seed + 1), 0.2, ranks, 0.3, 0.2, 7168)
    p, plans = _planner(trees=True, tree_budget=budget, gamma2=6), []
    plan_round = p.plan_round

    def recorded() -> Plan:
        plans.append(plan_round())
        return plans[-1]

    p.plan_round = recorded  # type: ignore[method-assign]
    simulate(p, regime, rounds=300, seed=seed)
    return plans


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ranks", [(0.96, 0.04), (0.85, 0.08, 0.03)])
def test_auto_runs_the_chains_schedule_where_trees_lose(ranks, seed):
    """Where no tree wins (the CPU at 7K: a verified token costs 3.6 ms, level 1's first candidate right 96% or 85% of
    the time), 'auto' plans exactly the rounds ``tree_budget=0`` plans from the same measurements, probes and
    level-0 and plain rounds included, for 300 rounds of jittered costs: its only extra cost is the weighing's time,
    not a different schedule."""
    auto, chains = _every_plan("auto", ranks, seed), _every_plan(0, ranks, seed)
    assert len(auto) == 300 and auto == chains
    assert "levels" in {plan.kind for plan in auto}
