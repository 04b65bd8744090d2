"""What the planner weighed in one call (totals and the latest decision only, so its size does not grow with the
call), read out as ``TriForceStats.planner`` by :meth:`~hf_triforce.hierarchy.planner.Planner.explain`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..stats import ms_text

UNMEASURED = "unmeasured"


def ms_per_token(tokens_per_second: float | None) -> float | None:
    """Milliseconds per token of a rate in tokens per second, rounded to the microsecond (``None``: unknown)."""
    if not tokens_per_second or tokens_per_second <= 0:
        return None
    return round(1e3 / tokens_per_second, 3)


@dataclass
class Weighed:
    """One schedule as the planner priced it at a decision: its best length, the acceptance and expected tokens per
    round it assumed, and the modeled tokens per second (0: a cost it needs was not measured yet)."""

    gamma2: int
    acceptance: float | None
    expected_tokens: float
    rate: float


@dataclass
class TreesWeighed:
    """``tree_budget='auto'``'s latest weighing: the modeled tokens per second of the best tree of each size and of
    the chain, what it chose (``None``: the chain) and why."""

    sizes: list[int]
    rates: list[float]
    chain_rate: float
    chosen: int | None
    reason: str


@dataclass
class ScheduleRecord:
    """Totals and the latest decision of one call's planner (see the module).

    Example:
        >>> record = ScheduleRecord()
        >>> record.ran("plain"); record.timed("plain", tokens=1, seconds=0.01)
        >>> record.rounds, record.measured_ms_per_token("plain")
        ({'plain': 1}, 10.0)
    """

    rounds: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # tokens of the timed rounds, per schedule
    seconds: dict[str, float] = field(default_factory=dict)
    timed_rounds: dict[str, int] = field(default_factory=dict)
    probes: int = 0
    decisions: int = 0
    switches: int = 0
    decided: str | None = None  # the schedule of the latest decision (probes excluded)
    decided_round: int = 0
    weighed: dict[str, Weighed] = field(default_factory=dict)  # the latest decision's candidates
    shape: str = "chain"  # of the latest "levels" round: "chain" or "tree:<nodes>"
    gamma1: int | None = None  # the latest level-1 step's level-0 drafts
    trees: TreesWeighed | None = None

    def ran(self, kind: str, tree_nodes: int | None = None) -> None:
        """A round of ``kind`` was planned (a ``"levels"`` round drafting a tree of ``tree_nodes``, or a chain)."""
        self.rounds[kind] = self.rounds.get(kind, 0) + 1
        if kind == "levels":
            self.shape = "chain" if tree_nodes is None else f"tree:{tree_nodes}"

    def timed(self, kind: str, tokens: int, seconds: float) -> None:
        """A round of ``kind`` gave ``tokens`` in ``seconds`` (the loop's time between round starts)."""
        self.tokens[kind] = self.tokens.get(kind, 0) + tokens
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.timed_rounds[kind] = self.timed_rounds.get(kind, 0) + 1

    def decide(self, kind: str, weighed: dict[str, Weighed], round_: int) -> None:
        """A decision (not a probe) chose ``kind`` from ``weighed``."""
        if self.decided is not None and kind != self.decided:
            self.switches += 1
        self.decided, self.weighed, self.decided_round = kind, weighed, round_
        self.decisions += 1

    def measured_ms_per_token(self, kind: str) -> float | None:
        """Milliseconds per token over the timed rounds of ``kind`` (``None``: none timed)."""
        tokens = self.tokens.get(kind, 0)
        return round(1e3 * self.seconds[kind] / tokens, 3) if tokens else None

    def schedule(self, kind: str, weighed: Weighed | None) -> dict[str, Any]:
        """``kind``'s entry of the explanation."""
        timed = self.tokens.get(kind, 0)
        entry: dict[str, Any] = {
            "rounds": self.rounds.get(kind, 0),
            "measured_ms_per_token": self.measured_ms_per_token(kind),
            "modeled_ms_per_token": None if weighed is None else ms_per_token(weighed.rate),
            "gamma2": None if weighed is None else weighed.gamma2,
            "expected_tokens": None if weighed is None else round(weighed.expected_tokens, 3),
            "acceptance": None if weighed is None or weighed.acceptance is None else round(weighed.acceptance, 3),
            "measured_tokens_per_round": round(timed / self.timed_rounds[kind], 3) if timed else None,
        }
        if kind == "levels":
            entry["shape"], entry["gamma1"] = self.shape, self.gamma1
        return entry

    def trees_dict(self, measured: dict[str, float | None]) -> dict[str, Any]:
        """The latest ``tree_budget='auto'`` weighing (call it once :attr:`trees` is set); ``measured``: tokens per
        second of the call's tree and chain rounds."""
        t = self.trees
        return {
            "chosen": t.chosen,
            "reason": t.reason,
            "chain_modeled_ms_per_token": ms_per_token(t.chain_rate),
            "sizes": t.sizes,
            "modeled_ms_per_token": [ms_per_token(rate) for rate in t.rates],
            "measured_ms_per_token": {shape: ms_per_token(rate) for shape, rate in measured.items()},
        }


def reason(
    kind: str | None, weighed: dict[str, Weighed], adaptive: bool, context_tokens: int | None, shape: str, rounds: int
) -> str:
    """One line saying why the call settled on ``kind``: its modeled milliseconds per token against the others'.

    Example:
        >>> w = {"levels": Weighed(6, 0.8, 3.9, 180.0), "plain": Weighed(0, None, 1.0, 100.0)}
        >>> reason("levels", w, True, 4096, "chain", 40)
        'levels (gamma2 6, chain): modeled 5.56 ms/token vs plain 10 ms/token at 4096 tokens of context'
    """
    at = "" if context_tokens is None else f" at {context_tokens} tokens of context"
    if kind is None:
        return f"no decision: the {rounds} rounds were first tries of each schedule{at}"
    costs = {k: ms_per_token(w.rate) for k, w in weighed.items()}
    chosen, what = weighed.get(kind), kind
    if chosen is not None and kind != "plain":
        what += f" (gamma2 {chosen.gamma2}, {shape})" if kind == "levels" else f" (gamma2 {chosen.gamma2})"
    others = ", ".join(f"{k} {ms_text(v, UNMEASURED)}" for k, v in costs.items() if k != kind)
    own = ms_text(costs.get(kind), UNMEASURED)
    if not adaptive:
        return f"fixed schedule (adaptive=False): {what} every round; modeled {own} ms/token vs {others} ms/token{at}"
    return f"{what}: modeled {own} ms/token vs {others} ms/token{at}"
