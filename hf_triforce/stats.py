"""Per-call statistics of a TriForce ``generate()``: tokens, time, forwards and per-level acceptance.

One vocabulary names the three levels everywhere (stats, phases, docs, CLI output):

* ``level0``: the drafter (n-gram lookup or a tiny model with a StreamingLLM cache);
* ``level1``: the target's weights over the retrieval view (a ``retrieval_budget``-token sparse KV cache);
* ``level2``: the target with its full KV cache, whose output is the output.

``levels["level0"]`` counts level-0 drafts judged by level 1, ``levels["level1"]`` level-1 drafts judged by
level 2.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class LevelStats:
    """Drafted, accepted and rejected counts for one verification level, and two acceptance figures.

    * :attr:`acceptance_rate`, the round rate ``accepted / drafted``: the share of drafted tokens kept. Drafts after
      a round's first rejection count as not accepted.
    * :attr:`per_token_acceptance`, ``alpha``: the probability that a drafted token is accepted given that every
      earlier draft of its round was, the figure the speculative-decoding and TriForce papers report.

    ``rejections`` counts the rounds that ended with a rejection (``accepted < drafted``).

    Example:
        >>> level = LevelStats(); level.record(6, 6); level.record(6, 2); level.record(6, 0)
        >>> level.drafted, level.accepted, level.rejections, level.acceptance_rate, level.per_token_acceptance
        (18, 8, 2, 0.4444444444444444, 0.8)
    """

    drafted: int = 0
    accepted: int = 0
    rejections: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The round rate ``accepted / drafted`` (0.0 when nothing was drafted).

        Example:
            >>> level = LevelStats(); level.record(4, 1); level.acceptance_rate
            0.25
        """
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_token_acceptance(self) -> float:
        """Per-token acceptance ``alpha``: the probability that a drafted token is accepted given that every earlier
        draft of its round was accepted (0.0 when nothing was drafted, 1.0 when drafts were never rejected).

        Estimated as ``accepted / (accepted + rejections)``, the maximum-likelihood estimate of ``alpha`` when each
        draft is accepted independently with probability ``alpha``: a round contributes its accepted drafts as
        successes and at most one failure, its first rejection (a fully accepted round contributes no failure).
        The drafts after a round's first rejection are never judged, so they count against the round rate but
        not here: ``per_token_acceptance >= acceptance_rate``. Rounds of different lengths (adaptive ``gamma``,
        drafts cut at ``max_length`` or at EOS) need no correction. With a fixed ``gamma`` it agrees, up to the
        small differences between the two estimators, with the papers' estimate, which solves
        ``E[accepted + 1] = (1 - alpha**(gamma + 1)) / (1 - alpha)`` for ``alpha`` from the mean accepted length.

        Example:
            >>> level = LevelStats(); level.record(6, 6); level.record(6, 2); level.record(6, 0)
            >>> level.per_token_acceptance, round(level.acceptance_rate, 3)  # 8 accepted, 2 rounds rejected
            (0.8, 0.444)
        """
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        """Fold in one round: its ``accepted`` leading drafts of the ``drafted`` that were judged.

        Example:
            >>> level = LevelStats(); level.record(3, 1); level.record(0, 0); level
            LevelStats(drafted=3, accepted=1, rejections=1)
        """
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += int(accepted < drafted)

    def to_dict(self) -> dict[str, Any]:
        """The counts and both acceptance figures (JSON-serializable).

        Example:
            >>> level = LevelStats(); level.record(6, 5); level.to_dict()  # doctest: +NORMALIZE_WHITESPACE
            {'drafted': 6, 'accepted': 5, 'rejections': 1, 'acceptance_rate': 0.8333333333333334,
             'per_token_acceptance': 0.8333333333333334}
        """
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejections": self.rejections,
            "acceptance_rate": self.acceptance_rate,
            "per_token_acceptance": self.per_token_acceptance,
        }


@dataclass
class PhaseTimes:
    """Wall-clock seconds of each call of each phase of a TriForce call (``durations``), and their totals and counts.

    On a GPU each phase ends with a device synchronization, so its time is the device's, not the launch
    time (the decode loop synchronizes after every level-1 step and verification anyway, to read the
    accepted tokens).
    """

    durations: dict[str, list[float]] = field(default_factory=dict)

    @property
    def seconds(self) -> dict[str, float]:
        """``{phase: total seconds}``."""
        return {phase: sum(each) for phase, each in self.durations.items()}

    @property
    def calls(self) -> dict[str, int]:
        """``{phase: calls}``."""
        return {phase: len(each) for phase, each in self.durations.items()}

    @contextlib.contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """Add the block's duration to ``phase``."""
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"triforce::{phase}"):  # a named range in torch.profiler traces
                yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        """Add one call of ``seconds`` to ``phase`` (timed by the caller: work spread over a forward's layers).

        Example:
            >>> times = PhaseTimes(); times.add("level1", 0.5); times.add("level1", 0.25)
            >>> times.seconds["level1"], times.calls["level1"]
            (0.75, 2)
        """
        self.durations.setdefault(phase, []).append(seconds)

    def to_dict(self) -> dict[str, dict[str, float]]:
        """``{phase: {"seconds": total, "calls": n, "ms_per_call": mean, "ms_median": median, "ms_max": largest}}``.

        The median and the largest call tell a phase's usual call from a one-off inside it (a Triton kernel
        compiled, a CUDA graph captured, the allocator growing), which the mean mixes in.

        Example:
            >>> times = PhaseTimes()
            >>> for seconds in (1.0, 0.004, 0.006): times.add("refresh", seconds)
            >>> {k: round(v, 1) for k, v in times.to_dict()["refresh"].items()}
            {'seconds': 1.0, 'calls': 3, 'ms_per_call': 336.7, 'ms_median': 6.0, 'ms_max': 1000.0}
        """
        return {k: _phase_dict(each) for k, each in self.durations.items()}


def _phase_dict(each: list[float]) -> dict[str, float]:
    """One phase of :meth:`PhaseTimes.to_dict` from its calls' seconds."""
    total = sum(each)
    return {"seconds": total, "calls": len(each), "ms_per_call": 1e3 * total / len(each),
            "ms_median": 1e3 * statistics.median(each), "ms_max": 1e3 * max(each)}  # fmt: skip


@dataclass
class TriForceStats:
    """What one TriForce ``generate()`` call did.

    ``level0`` counts level-0 drafts judged by level 1; ``level1`` counts level-1 drafts judged by the full
    cache (level 2); ``level0_to_level2`` counts level-0 drafts judged by level 2 directly (rounds that skip
    level 1). Each :class:`LevelStats` gives the round rate ``acceptance_rate`` (``accepted / drafted``) and the
    per-token acceptance ``per_token_acceptance`` (the papers' ``alpha``). ``rounds`` counts the rounds of each
    schedule the planner chose (``"levels"``: level 0 -> 1 -> 2, ``"level0"``: level 0 -> 2, ``"plain"``: a plain
    decoding step; see :mod:`hf_triforce.hierarchy.planner`).
    ``target_forwards`` counts full-cache verification forwards (the prefill excluded) and ``mean_accepted_length``
    is the mean number of tokens each of them produced. ``phases`` times the level-0 drafts (``level0``), the
    level-1 forwards (``level1``), retrieval re-selections (``refresh``), the full-cache verifications (``level2``),
    the ``prefill`` (of the uncached prompt tokens) and
    ``reuse`` (starting from a caller's cache and handing it back). ``reused_tokens`` counts the prompt tokens a
    caller's cache already held. ``*_bytes`` are the key/value bytes allocated by the full cache, the largest
    retrieval view, and the level-0 draft cache; with ``TriForceConfig.offload_kv`` the full cache lives in host
    memory and ``kv_bytes_to_device``/``kv_bytes_to_host`` count the key/value bytes copied over the bus each way
    (the prefill included). ``level1_weights`` says which weights level 1 drafted with
    (``"full"``, ``"int4"`` or ``"int8"``, ``TriForceConfig.level1_weights``), and ``level1_forward`` which forward
    ran them (``"direct"`` or ``"transformers"``, ``TriForceConfig.level1_forward``); ``verification_steps`` how the
    full-cache verifications ran (``"dynamic"`` shapes, or one sequence's fixed shapes: ``"graphs"`` replayed or
    ``"eager"``, see :mod:`hf_triforce.generation.fixed_verification`). ``rows`` is filled by a
    batched call only: one :class:`TriForceStats` per row of the batch, in its order, with that row's own acceptance
    at every level, its new tokens, and the verification forwards it took part in (``target_forwards``); the
    top-level figures are then the batch's totals, and its ``target_forwards`` counts batched forwards.
    ``tree_rounds`` counts the rounds whose level-1 drafts were a token tree (``TriForceConfig.tree_budget``) and
    ``tree_nodes`` their nodes, the root included (what those verifications forwarded); a tree round's level-1 verdict
    counts the nodes judged on the way down from the root as drafted. ``positional_acceptance`` holds what one
    sequence's call measured of level 1's candidates by rank (``trials[k]`` nodes offered a candidate of 0-based rank
    ``k``, ``accepted[k]`` took it; greedy chains count a rejection at the rank of the verifier's token among level
    1's choices, up to 8): the vector a tree's shape is built for.

    Example:
        >>> stats = TriForceStats(); stats.level1.record(6, 2); stats.level1.record(6, 6)
        >>> stats.to_dict()["levels"]["level1"]  # doctest: +NORMALIZE_WHITESPACE
        {'drafted': 12, 'accepted': 8, 'rejections': 1, 'acceptance_rate': 0.6666666666666666,
         'per_token_acceptance': 0.8888888888888888}
    """

    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    reused_tokens: int = 0
    target_forwards: int = 0
    decoded_tokens: int = 0
    retrieval_refreshes: int = 0
    tree_rounds: int = 0
    tree_nodes: int = 0
    positional_acceptance: dict[str, list[float]] = field(default_factory=dict)
    full_cache_bytes: int = 0
    view_bytes: int = 0
    draft_cache_bytes: int = 0
    kv_bytes_to_device: int = 0
    kv_bytes_to_host: int = 0
    level1_weights: str = "full"
    level1_forward: str = "transformers"
    verification_steps: str = "dynamic"
    level0: LevelStats = field(default_factory=LevelStats)
    level1: LevelStats = field(default_factory=LevelStats)
    level0_to_level2: LevelStats = field(default_factory=LevelStats)
    rounds: dict[str, int] = field(default_factory=dict)
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    rows: list[TriForceStats] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per full-cache verification forward."""
        return self.decoded_tokens / self.target_forwards if self.target_forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (JSON-serializable)."""
        skip = ("level0", "level1", "level0_to_level2", "phases", "rows")  # each converted below
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        out["mean_accepted_length"] = self.mean_accepted_length
        levels = {"level0": self.level0.to_dict(), "level1": self.level1.to_dict()}
        levels["level0_to_level2"] = self.level0_to_level2.to_dict()
        out["levels"] = levels
        out["phases"] = self.phases.to_dict()
        if self.rows:
            out["rows"] = [row.to_dict() for row in self.rows]
        return out
