"""How much to speculate, round by round: the schedule with the most expected tokens per second.

Each round ends with one full-cache (level-2) forward. Before it: ``"levels"`` (level 1 drafts ``gamma2`` tokens,
each level-1 step verifying up to ``gamma1`` level-0 drafts), ``"level0"`` (level 0's drafts go to level 2 directly)
or ``"plain"`` (nothing drafted). A round of ``g`` drafts accepted with per-token probability ``a`` yields
``sum_{i<=g} a**i`` tokens and costs the level-2 forward of width ``g + 1`` plus the drafting
(:mod:`~hf_triforce.hierarchy.cost_model`); the planner takes the schedule and length with the most tokens per
second within the user's ``gamma1``/``gamma2`` maxima, and re-tries the others every ``PROBE_EVERY`` rounds. Every
schedule is verified exactly: the choice changes speed, never the output. With ``adaptive=False`` every round is
``"levels"`` at ``gamma2`` and ``gamma1``.

Decisions come from counts, not clocks: the step costs are measured once per model, device and kind of call, before
the first round of the first call that needs them, by forwards whose results are discarded, and then fixed
(:mod:`~hf_triforce.hierarchy.calibration`); every round is priced from those costs and the call's acceptance counts,
so the same seed gives the same text whatever else the machine is doing.

For one sequence on one process a ``"levels"`` round drafts one more token while ``survival * a1`` (the chance that
every draft so far survives, from level 1's confidence in each, times the per-token acceptance) exceeds the rate
the call has reached times that token's cost (a level-1 step plus one more verified position): a Dinkelbach-style
rule, which converges to the best such stopping rule for the ratio (:meth:`Planner.keep_drafting`).

Under tensor parallelism each rank times itself, so rank 0 takes the adaptive decisions and broadcasts them
(:class:`~hf_triforce.hf.distributed.RankConsensus`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from ..config import TriForceConfig
from ..hf.distributed import RankConsensus
from .calibration import CallCosts, ScaledCost, StepCosts
from .cost_model import ConfidenceAcceptance, RunningRate, StreakAcceptance, expected_tokens
from .schedule_record import ScheduleRecord, TreesWeighed, Weighed, reason
from .tree_shape import MAX_BRANCH, PositionalAcceptance, TreeShape, best_tree, best_trees

PROBE_EVERY = 16  # rounds between re-tries of a schedule that is not chosen
AUTO_TREE_SIZES = (8, 16, 32, 64)
"""The tree sizes ``tree_budget='auto'`` weighs against the chain."""
SCHEDULE_MARGIN = 1.1
"""How much faster than the levels schedule another (level 0 -> 2, a plain step) must model to run instead: its
estimates rest on fewer verdicts, and each such round costs a full-cache verification for a token or two."""
TREE_MARGIN = 1.1
"""How much faster than the chain ``'auto'`` must model a tree (its wide verifications are extrapolated)."""
Kind = Literal["levels", "level0", "plain"]
KINDS: tuple[Kind, ...] = ("levels", "level0", "plain")  # the wire order of a plan's kind across ranks


@dataclass(frozen=True)
class Plan:
    """One round's schedule: ``kind`` and the tokens drafted for level 2 (``gamma2``, 0 for ``"plain"``); ``tree``:
    the token tree level 1 drafts instead of a chain (a ``"levels"`` round with ``TriForceConfig.tree_budget``)."""

    kind: Kind
    gamma2: int
    tree: TreeShape | None = None


class Planner:
    """Chooses each round's schedule and each level-1 step's ``gamma1`` from what the call measured.

    Args:
        config: ``gamma1``/``gamma2`` are the maxima; ``adaptive`` switches the planning on.
        consensus: how tensor-parallel ranks agree on each adaptive decision; ``None``: one process.
        one_sequence: one sampled sequence (``adaptive``, one process): ``"levels"`` rounds stop by
            :meth:`keep_drafting`. Greedy rounds run their planned length: level 2 accepts level 1's argmax by
            agreement, which level 1's probability predicts poorly (at 7K on the CPU, stopping by it cut greedy rounds
            from 6.05 to 5.08 tokens a verification at the same acceptance).
        trees: level 1 may draft token trees (``TriForceConfig.tree_budget``, :meth:`tree_for`).
        costs: the step costs to decide with (:func:`~hf_triforce.hierarchy.calibration.step_costs`); ``None``: new
            ones, to be measured (each step observed while :attr:`StepCosts.measuring` is timed into them).

    Example:
        >>> planner = Planner(TriForceConfig(gamma1=2, gamma2=6), has_drafter=True)
        >>> planner.plan_round()  # nothing measured yet: the first rounds try the speculating schedules
        Plan(kind='levels', gamma2=6, tree=None)
    """

    def __init__(
        self,
        config: TriForceConfig,
        has_drafter: bool,
        consensus: RankConsensus | None = None,
        one_sequence: bool = False,
        trees: bool = False,
        costs: CallCosts | None = None,
    ) -> None:
        self.config, self.has_drafter = config, has_drafter
        self.trees = trees
        self.positional = PositionalAcceptance()  # p_k of level 1's k-th candidate, for the trees' shape
        self.adaptive = config.adaptive
        self.by_confidence = ConfidenceAcceptance()
        self.reached = RunningRate()  # tokens per modeled second of the rounds so far
        self.reached_by_shape = {"tree": RunningRate(), "chain": RunningRate()}  # the same, of "levels" rounds
        self._last: Plan | None = None  # the plan of the round observe_round() times
        self._tree_tried = self._chain_tried = -PROBE_EVERY  # the last rounds that drafted a tree, a chain
        self.consensus = consensus if consensus is not None else RankConsensus(None)
        self.confidence_stops = one_sequence and config.adaptive and not self.consensus.active
        costs = costs or CallCosts(StepCosts())
        self.costs = costs.costs
        self.level2 = ScaledCost(self.costs.level2, costs.level2_factor)
        self.level1 = ScaledCost(self.costs.level1, costs.level1_factor)
        self.level0, self.refresh = (
            ScaledCost(self.costs.level0),
            ScaledCost(self.costs.refresh),
        )  # a re-selection: width 1
        self._modeled = 0.0  # modeled seconds of the round in progress
        self.a1, self.a0, self.a02 = StreakAcceptance(0.8), StreakAcceptance(0.6), StreakAcceptance(0.5)
        self.rounds = 0
        self.last_tried: dict[Kind, int] = {}
        self._steps_without_level0 = 0
        self.record = ScheduleRecord()  # what it weighed and chose, for the call's stats (:meth:`explain`)

    # -- decisions --------------------------------------------------------------------------------------------

    @property
    def timing(self) -> bool:
        """Whether the steps are being timed for the decisions (an adaptive call measuring its costs): the decoding
        loop synchronizes the device after each phase only then."""
        return self.adaptive and self.costs.measuring

    def plan_round(self, room: int | None = None) -> Plan:
        """The schedule of the next round; ``room``: the full cache's free slots (a token tree with more nodes is
        drafted as a chain: the cache holds ``max_length`` tokens and one chain round, never a tree's width)."""
        self.rounds += 1
        self._last = self._plan_round(room)
        self.record.ran(self._last.kind, None if self._last.tree is None else self._last.tree.size)
        if self._last.tree is not None:
            self._tree_tried = self.rounds
        elif self._last.kind == "levels":
            self._chain_tried = self.rounds
        return self._last

    def _plan_round(self, room: int | None) -> Plan:
        if not self.adaptive:
            return self._with_tree(Plan("levels", self.config.gamma2), room)
        probe = self._probe()
        self.record.probes += int(probe is not None)
        plan = self._agreed(probe if probe is not None else self._best())
        self.last_tried[plan.kind] = self.rounds
        if plan.kind == "levels":
            tree = self._with_tree(plan, room)
            if tree.tree is not None or not self.confidence_stops:
                return tree
            return Plan("levels", self.config.gamma2)  # the round's length is decided by keep_drafting
        return plan

    def tree_for(self, plan: Plan) -> TreeShape | None:
        """The token tree a ``"levels"`` round drafts (``None``: a chain). ``tree_budget=N``: the best tree of ``N``
        nodes and depth ``gamma2`` for the measured positional acceptance.
        ``'auto'`` (adaptive only): the size of :data:`AUTO_TREE_SIZES` with the most modeled tokens per second, where
        it beats the chain by :data:`TREE_MARGIN` and tree rounds were not measured slower than chain rounds; each
        shape is re-tried every :data:`PROBE_EVERY` rounds.

        Example:
            >>> planner = Planner(TriForceConfig(tree_budget=8, gamma2=4), has_drafter=False, trees=True)
            >>> planner.tree_for(Plan("levels", 4)).size <= 8
            True
        """
        budget = self.config.tree_budget
        if not self.trees or budget == 0:
            return None
        vector = self.positional.vector(MAX_BRANCH)
        if budget != "auto":
            return best_tree(vector, budget, self.config.gamma2)
        if not self.adaptive or len(self.level2.fastest) < 2 or not self.level1.known:
            return None  # the verification's cost by width is not measured yet
        if not self.positional.trials or self.positional.trials[0] < PROBE_EVERY:
            return None  # level 1's ranks not judged often enough yet: a tree would be built from the prior
        chain_rate = self._chain_rate(plan, vector[0])
        shapes = best_trees(vector, list(AUTO_TREE_SIZES), self.config.gamma2)
        best = max(shapes, key=self.tree_rate)
        if self.tree_rate(best) <= TREE_MARGIN * chain_rate:
            return self._weighed_trees(shapes, chain_rate, None, f"no tree models {TREE_MARGIN}x the chain's speed")
        if self._tree_tried > self._chain_tried and self.rounds - self._chain_tried >= PROBE_EVERY:
            return None  # a chain now and then among trees, so the rounds measure both shapes
        if self._trees_measured_slower() and self.rounds - self._tree_tried < PROBE_EVERY:
            return self._weighed_trees(shapes, chain_rate, None, "tree rounds measured slower than chain rounds")
        why = f"the {best.size}-node tree models over {TREE_MARGIN}x the chain's speed"
        return self._weighed_trees(shapes, chain_rate, best, why)

    def _chain_rate(self, plan: Plan, first: float) -> float:
        """The chain's tokens per second, as planned (the latest streak) or priced as the trees are (its nodes at the
        positional acceptance's first rank ``first``, any length up to ``gamma2``), whichever is higher: a tree must
        win by its branches, not by an acceptance estimate the chain was not given."""
        lengths = range(1, self.config.gamma2 + 1)
        chains = best_trees([first], [g + 1 for g in lengths], self.config.gamma2)
        return max([self.rate(Plan(plan.kind, plan.gamma2)), *map(self.tree_rate, chains)])

    def _weighed_trees(
        self, shapes: list[TreeShape], chain_rate: float, chosen: TreeShape | None, why: str
    ) -> TreeShape | None:
        """Keep ``'auto'``'s weighing in the record; returns ``chosen``."""
        rates = [self.tree_rate(shape) for shape in shapes]
        size = None if chosen is None else chosen.size
        self.record.trees = TreesWeighed([shape.size for shape in shapes], rates, chain_rate, size, why)
        return chosen

    def _trees_measured_slower(self) -> bool:
        """Whether the call's tree rounds measured fewer tokens per second than its chain rounds."""
        tree, chain = self.reached_by_shape["tree"].rate, self.reached_by_shape["chain"].rate
        return tree is not None and chain is not None and tree < chain

    def tree_rate(self, shape: TreeShape) -> float:
        """Expected tokens per second of a round that drafts the tree ``shape`` (0 while a cost is unknown)."""
        verify = self.level2(shape.size)
        steps = [self.level1(width) for width in tree_widths(shape)]
        if verify is None or any(step is None for step in steps):
            return 0.0
        seconds = verify + sum(steps) + self._refresh_per_round(shape.expected_tokens)
        return shape.expected_tokens / seconds

    def _with_tree(self, plan: Plan, room: int | None) -> Plan:
        """``plan`` with the token tree :meth:`tree_for` chooses, if one does and its nodes fit in ``room``."""
        tree = self.tree_for(plan)
        if tree is None or (room is not None and tree.size > room):
            return plan
        return Plan(plan.kind, plan.gamma2, tree)

    def keep_drafting(self, drafted: int, survival: float) -> bool:
        """Whether a ``"levels"`` round that drafted ``drafted`` tokens should draft one more.

        ``survival``: the estimated chance that all ``drafted`` are accepted (the product of their
        :meth:`token_acceptance`); the rule is the module's. ``True`` for a batch or before the costs are measured.

        Example:
            >>> p = Planner(TriForceConfig(), has_drafter=False, one_sequence=True)
            >>> p.level1.observe(1, 0.02); p.level2.observe(2, 0.10); p.level2.observe(3, 0.11)  # 10 ms a token
            >>> p.reached.observe(tokens=4, seconds=0.2)  # 20 tokens per modeled second so far
            >>> p.keep_drafting(1, survival=0.99), p.keep_drafting(1, survival=0.5)
            (True, False)
        """
        if not self.confidence_stops:
            return True
        per_token, verify = self._level1_seconds_per_token(), self.level2.slope()
        if per_token is None or verify is None or self.reached.rate is None:
            return True
        return survival * self.a1.rate > self.reached.rate * (per_token + verify)

    def token_acceptance(self, confidence: float) -> float:
        """The estimated chance that level 2 accepts a level-1 token drawn with probability ``confidence``."""
        return self.by_confidence.rate(confidence)

    def gamma1(self) -> int:
        """Level-0 drafts for the next level-1 step (0: level 1 decodes one token on its own)."""
        self.record.gamma1 = self._gamma1()
        return self.record.gamma1

    def _gamma1(self) -> int:
        if not self.has_drafter:
            return 0
        if not self.adaptive:
            return self.config.gamma1
        if not self.a0.verdicts:  # level 0 never judged yet: try it first
            return self.config.gamma1
        best = max(range(self.config.gamma1 + 1), key=self._level1_rate)
        self._steps_without_level0 = 0 if best else self._steps_without_level0 + 1
        if self._steps_without_level0 >= PROBE_EVERY:  # re-measure level 0 now and then
            self._steps_without_level0, best = 0, self.config.gamma1
        (best,) = self.consensus.agree([best])  # rank 0's timings decide, on every rank
        return best

    def _agreed(self, plan: Plan) -> Plan:
        """``plan`` on one process; rank 0's plan on every rank of a tensor-parallel model."""
        if not self.consensus.active:
            return plan
        kind, gamma2 = self.consensus.agree([KINDS.index(plan.kind), plan.gamma2])
        return Plan(KINDS[kind], gamma2)

    def _probe(self) -> Plan | None:
        """A speculating schedule not run for ``PROBE_EVERY`` rounds (or ever), at the length the estimates favour for
        it: level 0 -> 2 only where it could win by :data:`SCHEDULE_MARGIN` at the better of level 2's and level 1's
        acceptance of level 0's drafts. A plain step is never probed: its cost is measured and it has no acceptance to
        learn."""
        for kind in self._kinds()[:-1]:
            if self.rounds - self.last_tried.get(kind, -PROBE_EVERY) < PROBE_EVERY:
                continue
            if kind == "levels":
                return self._best_of(kind)
            best = max(self.rate(Plan("plain", 0)), self.rate(self._best_of("levels")))
            if self._could_win(SCHEDULE_MARGIN * best):
                return self._best_of(kind)
        return None

    def _best(self) -> Plan:
        candidates = [Plan("plain", 0)] + [self._best_of(kind) for kind in self._kinds()[:-1]]
        best = max(candidates, key=self._margined_rate)
        by_kind = {plan.kind: plan for plan in candidates}
        self.record.decide(best.kind, {kind: self._weigh(by_kind[kind]) for kind in self._kinds()}, self.rounds)
        return best

    def _could_win(self, rate: float) -> bool:
        """Whether a level 0 -> 2 round of some length beats ``rate`` at the better of level 2's and level 1's
        acceptance of level 0's drafts."""
        optimistic = max(self.a02.rate, self.a0.rate)
        return any(self.rate(Plan("level0", g), optimistic) >= rate for g in range(1, self._longest("level0") + 1))

    def _margined_rate(self, plan: Plan) -> float:
        """:meth:`rate`, a schedule other than levels discounted by :data:`SCHEDULE_MARGIN`."""
        return self.rate(plan) / (1.0 if plan.kind == "levels" else SCHEDULE_MARGIN)

    def _best_of(self, kind: Kind) -> Plan:
        """The length of ``kind`` with the most expected tokens per second (the longest while none is known)."""
        plans = [Plan(kind, g) for g in range(self._longest(kind), 0, -1)]
        return max(plans, key=self.rate)

    def _kinds(self) -> list[Kind]:
        """The schedules, in the order the first rounds try them (speculating first)."""
        return ["levels", "level0", "plain"] if self.has_drafter else ["levels", "plain"]

    def _longest(self, kind: Kind) -> int:
        return self.config.gamma2 if kind == "levels" else self.config.gamma1 + self.config.gamma2

    # -- the model --------------------------------------------------------------------------------------------

    def _weigh(self, plan: Plan) -> Weighed:
        """``plan`` as the model prices it: the acceptance and expected tokens per round it assumes, its rate."""
        acceptance = {"levels": self.a1.rate, "level0": self._level0_acceptance()}.get(plan.kind)
        tokens = 1.0 if acceptance is None else expected_tokens(acceptance, plan.gamma2)
        return Weighed(plan.gamma2, acceptance, tokens, self.rate(plan))

    def _level0_acceptance(self) -> float:
        """Level 2's per-token acceptance of level-0 drafts: measured while level 0 -> 2 rounds run (one within
        ``PROBE_EVERY`` rounds); before any, level 1's acceptance of them, which every levels round counts; else the
        lower of the two (a passage level 0 stopped predicting is not priced at an old streak)."""
        if not self.a0.verdicts:
            return self.a02.rate
        if not self.a02.verdicts:
            return self.a0.rate
        fresh = self.rounds - self.last_tried.get("level0", -PROBE_EVERY) < PROBE_EVERY
        return self.a02.rate if fresh else min(self.a02.rate, self.a0.rate)

    def rate(self, plan: Plan, level0_acceptance: float | None = None) -> float:
        """Expected tokens per second of a round run by ``plan`` (0 when a cost it needs is unknown); a level 0 -> 2
        round at ``level0_acceptance`` if given."""
        verify = self.level2(plan.gamma2 + 1)
        if verify is None:
            return 0.0
        if plan.kind == "plain":
            return 1.0 / verify
        if plan.kind == "level0":
            draft = self.level0(plan.gamma2)
            acceptance = self._level0_acceptance() if level0_acceptance is None else level0_acceptance
            return 0.0 if draft is None else expected_tokens(acceptance, plan.gamma2) / (verify + draft)
        per_token = self._level1_seconds_per_token()
        if per_token is None:
            return 0.0
        tokens = expected_tokens(self.a1.rate, plan.gamma2)
        return tokens / (verify + plan.gamma2 * per_token + self._refresh_per_round(tokens))

    def _refresh_per_round(self, tokens: float) -> float:
        """Re-selection seconds per round of ``tokens``: one re-selection per ``refresh_every`` tokens."""
        return (self.refresh(1) or 0.0) * min(1.0, tokens / self.config.refresh_every)

    def _level1_rate(self, gamma1: int) -> float:
        """Level-1 tokens per second of a level-1 step with ``gamma1`` level-0 drafts."""
        step = self.level1(gamma1 + 1)
        draft = self.level0(gamma1) if gamma1 else 0.0
        if step is None or draft is None:
            return 0.0 if gamma1 else 1.0  # unmeasured: level 1 on its own
        return expected_tokens(self.a0.rate, gamma1) / (step + draft)

    def _level1_seconds_per_token(self) -> float | None:
        gammas = range(self.config.gamma1 + 1) if self.has_drafter else range(1)
        rate = max(self._level1_rate(g) for g in gammas)
        return None if rate <= 0 or not self.level1.known else 1.0 / rate

    # -- observations -----------------------------------------------------------------------------------------

    def observe_level2(
        self,
        plan: Plan,
        drafted: int,
        accepted: int,
        seconds: float | None,
        confidences: list[float] | None = None,
        rank: int | None = None,
        requested: int | None = None,
    ) -> None:
        """A round's verification: ``accepted`` of ``drafted`` tokens, a ``drafted + 1``-wide forward of ``seconds``;
        ``confidences``: level 1's probability of each draft; ``rank`` (greedy): the 0-based rank of the verifier's
        token in level 1's scores where it rejected (every greedy node counts as a trial for every rank);
        ``requested``: the drafts a level 0 -> 2 round asked level 0 for. A proposal that came up short of them (an
        n-gram without a match proposes nothing) and was accepted whole counts as a rejection at its end: the round
        yielded what a rejection there yields, and a level-0 estimate that skipped such rounds priced level 0 -> 2 at
        the drafts it happened to have."""
        if seconds is not None:  # None: the caller counted the forward (a batch's, as wide as its widest row)
            self.step(self.level2, drafted + 1, seconds)
        judged = drafted  # level 2's verdict as the acceptance estimates count it
        if plan.kind == "level0" and requested is not None and accepted == drafted < requested:
            judged = accepted + 1
        if plan.kind != "levels":
            self.a1.idle(accepted + 1)
        if plan.kind != "level0":
            self.a02.idle(accepted + 1)
        if plan.kind == "levels":
            self.a1.observe(drafted, accepted)
            if rank is None:
                self.positional.observe_chain(drafted, accepted)
            else:  # greedy: the rank of the verifier's token among level 1's candidates at the first miss
                self.positional.observe_chain(drafted, accepted, MAX_BRANCH, rank if rank < MAX_BRANCH else -1)
            if confidences:
                self.by_confidence.observe(confidences, accepted)
        elif plan.kind == "level0":
            self.a02.observe(judged, accepted)

    def observe_level1(self, drafted: int, accepted: int, seconds: float) -> None:
        """A level-1 step over ``drafted`` level-0 drafts (``accepted`` kept), ``drafted + 1`` wide."""
        self.step(self.level1, drafted + 1, seconds)
        self.a0.observe(drafted, accepted)

    def observe_tree_step(self, width: int, seconds: float) -> None:
        """A level-1 forward over ``width`` nodes of a token tree's frontier took ``seconds``."""
        self.step(self.level1, width, seconds)

    def observe_tree(self, ranks: list[int], children: list[int], seconds: float, size: int) -> None:
        """A token tree's verification: at each node visited from the root, the rank accepted (``-1``: none) of its
        ``children`` candidates; the forward of ``size`` nodes took ``seconds``."""
        self.step(self.level2, size, seconds)
        for rank, count in zip(ranks, children, strict=True):
            self.positional.observe(count, rank)
        accepted = sum(1 for rank in ranks if rank >= 0)
        self.a1.observe(len(ranks), accepted)
        self.a02.idle(accepted + 1)

    def observe_level0(self, requested: int, seconds: float) -> None:
        """One level-0 proposal of up to ``requested`` tokens took ``seconds``."""
        self.step(self.level0, requested, seconds)

    def observe_round(self, tokens: int, seconds: float) -> None:
        """A whole round (drafting, verification and what the loop did around them) gave ``tokens`` in ``seconds`` of
        wall clock (the explanation's measured figures). The rates the decisions weigh count the round at its modeled
        seconds (its steps at the costs)."""
        if self._last is not None:
            self.record.timed(self._last.kind, tokens, seconds)
        modeled, self._modeled = self._modeled, 0.0
        if modeled <= 0:
            return
        self.reached.observe(tokens, modeled)
        if self._last is not None and self._last.kind == "levels":
            self.reached_by_shape["chain" if self._last.tree is None else "tree"].observe(tokens, modeled)

    def observe_refresh(self, seconds: float) -> None:
        """One re-selection of the retrieval chunks took ``seconds``."""
        self.step(self.refresh, 1, seconds)

    def step(self, cost: ScaledCost, width: int, seconds: float) -> None:
        """One step of ``cost``'s kind and ``width`` ran: timed into the costs while they are measured, and counted
        at its modeled cost into the round."""
        if self.costs.measuring:
            cost.observe(width, seconds)
        self._modeled += cost(width) or 0.0

    # -- the explanation --------------------------------------------------------------------------------------

    def explain(self, context_tokens: int | None = None) -> dict[str, Any]:
        """What the planner weighed and why it settled where it did, JSON-ready and of bounded size (the call's
        ``TriForceStats.planner``); ``context_tokens``: the full cache's length, for the reason's wording.

        Per schedule (``"levels"``, ``"level0"`` with a drafter, ``"plain"``): the rounds planned, milliseconds per
        token measured over its timed rounds (whole rounds, overheads included; a call's last round is not timed) and
        modeled at the latest decision, at the length (``gamma2``), per-token acceptance and expected tokens per round
        the model used. A decision is a round that was not a probe; ``switches`` counts decisions that changed the
        schedule. Without ``adaptive``, or before any decision, the modeled figures are priced at the end of the call
        (``modeled_at_round``). ``trees``: ``tree_budget='auto'``'s latest weighing, when it weighed.

        Example:
            >>> p = Planner(TriForceConfig(gamma2=4), has_drafter=False)
            >>> for w in (1, 5): p.level2.observe(w, 0.010 + 0.001 * (w - 1))
            >>> p.level1.observe(1, 0.002); p.rounds = p.last_tried["levels"] = p.last_tried["plain"] = 20
            >>> p.plan_round().kind
            'levels'
            >>> e = p.explain(context_tokens=4096)
            >>> e["chosen"], e["schedules"]["plain"]["modeled_ms_per_token"]
            ('levels', 10.0)
            >>> e["reason"]
            'levels (gamma2 3, chain): modeled 6.44 ms/token vs plain 10 ms/token at 4096 tokens of context'
        """
        record = self.record
        if self.adaptive and record.decided is not None:
            chosen, weighed, at = record.decided, record.weighed, record.decided_round
        else:  # priced now: the fixed schedule's length, each other schedule at its best
            chosen = "levels" if not self.adaptive else None
            plans = [self._best_of(kind) if kind != "plain" else Plan("plain", 0) for kind in self._kinds()]
            if not self.adaptive:
                plans[0] = Plan("levels", self.config.gamma2)
            weighed, at = {plan.kind: self._weigh(plan) for plan in plans}, self.rounds
        out: dict[str, Any] = {
            "adaptive": self.adaptive,
            "chosen": chosen,
            "reason": reason(chosen, weighed, self.adaptive, context_tokens, record.shape, self.rounds),
            "rounds": self.rounds,
            "decisions": record.decisions,
            "probes": record.probes,
            "switches": record.switches,
            "modeled_at_round": at,
            "stops_by_confidence": self.confidence_stops,
            "context_tokens": context_tokens,
            "schedules": {kind: record.schedule(kind, weighed.get(kind)) for kind in self._kinds()},
        }
        if record.trees is not None:
            out["trees"] = record.trees_dict({shape: rate.rate for shape, rate in self.reached_by_shape.items()})
        return out


def tree_widths(shape: TreeShape) -> list[int]:
    """Level 1's forward widths to expand ``shape``: per depth, the nodes there that have children.

    Example:
        >>> tree_widths(TreeShape([-1, 0, 0, 1, 2, 2], 1.0))
        [1, 2]
    """
    children = shape.children
    widths = Counter(depth for node, depth in enumerate(shape.depths) if children[node])
    return [widths[d] for d in sorted(widths)]
