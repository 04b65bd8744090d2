"""TriForceStats: one vocabulary for the levels, and the two acceptance figures (the round rate and the per-token
acceptance alpha)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hf_triforce import TriForceStats
from hf_triforce.bench.formatting import acceptances, per_token_acceptance, phase_cell
from hf_triforce.stats import LevelStats, PhaseTimes

pytestmark = pytest.mark.unit


def _stats() -> TriForceStats:
    stats = TriForceStats()
    stats.level0.record(4, 3)
    stats.level1.record(6, 5)
    for phase in ("prefill", "level0", "level1", "refresh", "level2"):
        with stats.phases.measure(phase):
            pass
    return stats


def test_a_one_off_call_moves_the_mean_not_the_median():
    """On an H200 a refresh's mean was 36 ms over 28 calls while its usual call took 5 ms (one kernel compile
    inside the timed call): each phase keeps every call, and a table cell shows the median beside such a mean."""
    times = PhaseTimes()
    for ms in [1000.0] + [5.0] * 27:
        times.add("refresh", ms / 1e3)
    for ms in [10.0, 11.0, 9.0]:
        times.add("level1", ms / 1e3)
    refresh, level1 = times.to_dict()["refresh"], times.to_dict()["level1"]
    assert refresh["ms_per_call"] == pytest.approx(1135 / 28) and refresh["ms_median"] == pytest.approx(5.0)
    assert refresh["ms_max"] == pytest.approx(1000.0) and refresh["calls"] == 28
    assert phase_cell(refresh) == "40.5 (28; median 5.0)"
    assert phase_cell(level1) == "10.0 (3)"  # no slow call: the mean alone, as before
    assert phase_cell({"calls": 2, "ms_per_call": 40.0}) == "40.0 (2)"  # recorded before medians were kept


def test_to_dict_uses_the_level_vocabulary_only():
    d = json.loads(json.dumps(_stats().to_dict()))
    assert set(d["levels"]) == {"level0", "level1", "level0_to_level2"}
    assert set(d["phases"]) == {"prefill", "level0", "level1", "refresh", "level2"}
    assert d["levels"]["level1"] == {
        "drafted": 6,
        "accepted": 5,
        "rejections": 1,
        "acceptance_rate": 5 / 6,
        "per_token_acceptance": 5 / 6,
    }


def test_the_01_names_are_gone():
    stats = _stats()
    assert not hasattr(stats, "draft") and not hasattr(stats, "retrieval")
    with pytest.raises(KeyError):
        stats.to_dict()["levels"]["retrieval"]


# ---------------------------------------------------------------------------------------------------
# Round rate and per-token acceptance


def _level(*rounds: tuple[int, int]) -> LevelStats:
    level = LevelStats()
    for drafted, accepted in rounds:
        level.record(drafted, accepted)
    return level


def test_per_token_acceptance_of_hand_built_rounds():
    level = _level((6, 6), (6, 2), (6, 0))  # one round fully accepted, two ended by a rejection
    assert (level.drafted, level.accepted, level.rejections) == (18, 8, 2)
    assert level.acceptance_rate == pytest.approx(8 / 18)
    assert level.per_token_acceptance == pytest.approx(0.8)  # 8 successes, 2 failures; 8 drafts never judged
    d = json.loads(json.dumps(level.to_dict()))
    assert d == {
        "drafted": 18,
        "accepted": 8,
        "rejections": 2,
        "acceptance_rate": pytest.approx(8 / 18),
        "per_token_acceptance": pytest.approx(0.8),
    }


@pytest.mark.parametrize(
    ("rounds", "rate", "alpha"),
    [
        ((), 0.0, 0.0),  # nothing drafted
        (((0, 0), (0, 0)), 0.0, 0.0),  # empty rounds: no draft, no rejection
        (((4, 4), (2, 2)), 1.0, 1.0),  # never rejected
        (((4, 0), (3, 0)), 0.0, 0.0),  # every round rejected its first draft
        (((1, 0), (1, 1)), 0.5, 0.5),  # one-draft rounds: the two figures agree
    ],
)
def test_acceptance_edge_cases(rounds, rate, alpha):
    level = _level(*rounds)
    assert level.acceptance_rate == rate and level.per_token_acceptance == alpha


@given(st.lists(st.integers(0, 8).flatmap(lambda d: st.tuples(st.just(d), st.integers(0, d))), max_size=30))
def test_per_token_acceptance_is_never_below_the_round_rate(rounds):
    level = _level(*rounds)
    assert level.rejections == sum(a < d for d, a in rounds)
    assert 0.0 <= level.acceptance_rate <= level.per_token_acceptance <= 1.0


def _geometric_rounds(alpha: float, gamma: int, n: int, seed: int) -> list[tuple[int, int]]:
    """``n`` rounds of ``gamma`` drafts, each accepted with probability ``alpha`` until the first rejection."""
    rng = random.Random(seed)
    rounds = []
    for _ in range(n):
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        rounds.append((gamma, accepted))
    return rounds


def _alpha_from_mean_accepted_length(mean_tokens: float, gamma: int) -> float:
    """The papers' estimate: solve ``mean_tokens = (1 - a**(gamma + 1)) / (1 - a)`` for ``a`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(gamma + 1)) < mean_tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_per_token_acceptance_recovers_alpha_of_simulated_rounds(alpha):
    gamma, n = 6, 20_000
    rounds = _geometric_rounds(alpha, gamma, n, seed=18)
    level = _level(*rounds)
    assert level.per_token_acceptance == pytest.approx(alpha, abs=0.01)
    assert level.acceptance_rate < alpha - 0.05, "the round rate underestimates alpha"
    papers = _alpha_from_mean_accepted_length(sum(a + 1 for _, a in rounds) / n, gamma)
    assert level.per_token_acceptance == pytest.approx(papers, abs=0.01)


def test_per_token_acceptance_needs_no_fixed_gamma():
    """Rounds of varying length (adaptive gamma, drafts cut at max_length or EOS) are pooled without correction."""
    rng = random.Random(7)
    rounds = [r for gamma in (1, 2, 4, 8) for r in _geometric_rounds(0.8, gamma, 5_000, seed=rng.randrange(2**31))]
    assert _level(*rounds).per_token_acceptance == pytest.approx(0.8, abs=0.01)


def test_acceptance_cells():
    level = _level((6, 6), (6, 2), (6, 0)).to_dict()
    assert acceptances(level) == "0.44 / 0.80" and per_token_acceptance(level, 3) == "0.800"
    old = {"drafted": 18, "accepted": 8, "acceptance_rate": 8 / 18}  # recorded before per-token acceptance
    assert acceptances(old) == "0.44 / -" and acceptances({"drafted": 0}) == "-"


def test_decode_speed_leaves_the_prefill_out():
    stats = TriForceStats(seconds=5.0, prefill_seconds=3.0, decoded_tokens=50, new_tokens=51)
    assert stats.decode_tokens_per_second == 25.0 and stats.to_dict()["decode_tokens_per_second"] == 25.0
    assert TriForceStats().decode_tokens_per_second == 0.0  # nothing decoded yet


def test_printing_the_stats_is_one_short_line_not_every_timing():
    """``print(last_stats(model))`` used to dump every phase's list of timings; it is one line now."""
    stats = _stats()
    for _ in range(500):
        stats.phases.add("level1", 0.01)
    stats.rows = [_stats(), _stats()]
    text = str(stats)
    assert text == repr(stats) and "\n" not in text and len(text) < 250
    assert "durations" not in text and "0.01" not in text and "rows=2" in text
    assert text.startswith("TriForceStats(new_tokens=0, ") and "level0: 0.75, level1: 0.83" in text
