"""What a TriForce call did, checked from its own statistics: the tests' guard against passing by not speculating.

Greedy output equal to plain ``generate()`` also comes from a TriForce that quietly decodes plainly, and sampled
output with the right distribution too. Every greedy-equality and sampling test therefore also asserts, from the
call's fresh :func:`hf_triforce.last_stats` (reset at the start of every call), that the path it names ran:
:func:`check_ran` with a :class:`Ran`. :class:`ForcedPlans` fixes each round's schedule, so which path runs does not
depend on the machine's timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_triforce.hierarchy.planner import Plan, Planner
from hf_triforce.stats import TriForceStats

LEVELS = ("level0", "level1", "level0_to_level2")
"""The stats' levels: level-0 drafts judged by level 1, level-1 drafts judged by level 2, level-0 drafts judged by
level 2 directly (``"level0"`` rounds)."""


@dataclass(frozen=True)
class Ran:
    """What a TriForce call must show it did, read from its own statistics (:func:`check_ran`).

    Attributes:
        drafted: levels (of :data:`LEVELS`) that must have drafted at least one token.
        rejected: levels that must have rejected at least one draft (the rejection path: a crop, and a residual
            when sampling).
        accepted: levels that must have accepted at least one draft.
        rounds: round kinds (``"levels"``, ``"level0"``, ``"plain"``) that must have run at least once.
        full_rounds: at least one ``"levels"`` round had every level-1 draft accepted (level 2's bonus token ran).
    """

    drafted: tuple[str, ...] = ("level1",)
    rejected: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    rounds: tuple[str, ...] = ()
    full_rounds: bool = False


LEVEL1_DRAFTED = Ran()
"""The least a speculating call shows: level 1 drafted."""
NOTHING = Ran(drafted=())
"""A call that drafts nothing (one new token: the prefill's, no round)."""


def check_ran(stats: TriForceStats | dict, ran: Ran) -> None:
    """Assert that ``stats`` (a :class:`TriForceStats` or its ``to_dict()``) show the path ``ran`` names."""
    data = stats if isinstance(stats, dict) else stats.to_dict()
    levels, rounds = data["levels"], data.get("rounds", {})
    summary = f"levels={dict(levels)} rounds={rounds}"
    for level in ran.drafted:
        assert levels[level]["drafted"] > 0, f"{level} drafted nothing: the path this case tests never ran ({summary})"
    for level in ran.rejected:
        assert levels[level]["rejections"] > 0, f"{level} never rejected a draft ({summary})"
    for level in ran.accepted:
        assert levels[level]["accepted"] > 0, f"{level} never accepted a draft ({summary})"
    for kind in ran.rounds:
        assert rounds.get(kind, 0) > 0, f"no {kind!r} round ran ({summary})"
    if ran.full_rounds:  # a batch row's stats count its verifications, not rounds by kind
        verified = rounds.get("levels", 0) if rounds else data["target_forwards"]
        assert verified > levels["level1"]["rejections"], f"no fully accepted round ({summary})"
    if not ran.drafted:
        assert all(levels[level]["drafted"] == 0 for level in LEVELS), f"expected no drafts ({summary})"


class ForcedPlans:
    """Every round's schedule taken from ``kinds`` in turn (``"levels"``, ``"level0"``, ``"plain"``), at the
    config's longest lengths, instead of the planner's choice: deterministic paths for the tests of each kind."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds

    def plan_round(self, planner: Planner) -> Plan:
        kind = self.kinds[planner.rounds % len(self.kinds)]
        planner.rounds += 1
        cfg = planner.config
        if kind == "level0" and not planner.has_drafter:
            kind = "levels"
        gamma2 = {"levels": cfg.gamma2, "level0": cfg.gamma1 + cfg.gamma2, "plain": 0}[kind]
        return Plan(kind, gamma2)
