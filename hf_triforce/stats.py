"""Per-call statistics of a TriForce ``generate()``: tokens, time, forwards and per-level acceptance (``level0`` the
drafter, ``level1`` the target over the retrieval view, ``level2`` the target with its full KV cache)."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch


@dataclass
class LevelStats:
    """Drafted, accepted and rejected counts for one verification level, and two acceptance figures:
    :attr:`acceptance_rate` and :attr:`per_token_acceptance`. ``rejections`` counts the rounds that ended with a
    rejection (``accepted < drafted``).

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
        """The round rate ``accepted / drafted``, the share of drafted tokens kept (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_token_acceptance(self) -> float:
        """Per-token acceptance ``alpha`` (the papers' figure): the probability that a draft is accepted given that
        every earlier draft of its round was, estimated as ``accepted / (accepted + rejections)`` (maximum likelihood;
        drafts after a rejection are never judged, so ``per_token_acceptance >= acceptance_rate``)."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        """Fold in one round: its ``accepted`` leading drafts of the ``drafted`` that were judged."""
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += int(accepted < drafted)

    def to_dict(self) -> dict[str, Any]:
        """The counts and both acceptance figures (JSON-serializable; see :class:`TriForceStats`' example)."""
        rates = {"acceptance_rate": self.acceptance_rate, "per_token_acceptance": self.per_token_acceptance}
        return {**asdict(self), **rates}


_TIMING: contextvars.ContextVar[bool] = contextvars.ContextVar("triforce_phase_timing", default=False)


@contextlib.contextmanager
def phase_timing() -> Iterator[None]:
    """Within the block, TriForce calls synchronize the device after each phase, so their
    :attr:`TriForceStats.phases` are device times (for profiling: a synchronization in the decoding loop costs a GPU
    the overlap of its launches). Nothing changes on a CPU.

    Example:
        >>> with hf_triforce.phase_timing():  # doctest: +SKIP
        ...     model.generate(ids, max_new_tokens=64, triforce_config=TriForceConfig())
        >>> hf_triforce.last_stats(model).phases.to_dict()["level1"]["ms_median"]  # doctest: +SKIP
        12.4
    """
    token = _TIMING.set(True)
    try:
        yield
    finally:
        _TIMING.reset(token)


def timing_requested() -> bool:
    """Whether the caller asked for device times (:func:`phase_timing`)."""
    return _TIMING.get()


@dataclass
class PhaseTimes:
    """Wall-clock seconds of each call of each phase (``durations``), and their totals and counts. On a GPU a phase
    ends with a device synchronization only while ``synchronize`` (the planner measuring its costs, or
    :func:`phase_timing`): otherwise its time is the host's, launches included, not the device's."""

    durations: dict[str, list[float]] = field(default_factory=dict)
    synchronize: bool = field(default=False, repr=False, compare=False)

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
            if self.synchronize and torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        """Add one call of ``seconds`` to ``phase`` (timed by the caller: work spread over a forward's layers)."""
        self.durations.setdefault(phase, []).append(seconds)

    def to_dict(self) -> dict[str, dict[str, float]]:
        """``{phase: {"seconds": total, "calls": n, "ms_per_call": mean, "ms_median": median, "ms_max": largest}}``;
        the median and the largest tell a phase's usual call from a one-off (a kernel compiled, a graph captured)."""
        return {k: _phase_dict(each) for k, each in self.durations.items()}


def ms_text(value: float | None, unknown: str = "-") -> str:
    """Milliseconds to two decimals, trailing zeros dropped (``unknown`` for ``None``).

    Example:
        >>> ms_text(10.0), ms_text(6.444), ms_text(None)
        ('10', '6.44', '-')
    """
    return unknown if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def _phase_dict(each: list[float]) -> dict[str, float]:
    """One phase of :meth:`PhaseTimes.to_dict` from its calls' seconds."""
    total = sum(each)
    return {"seconds": total, "calls": len(each), "ms_per_call": 1e3 * total / len(each),
            "ms_median": 1e3 * statistics.median(each), "ms_max": 1e3 * max(each)}  # fmt: skip


@dataclass
class TriForceStats:
    """What one TriForce ``generate()`` call did.

    Attributes:
        new_tokens: tokens generated.
        seconds: wall-clock seconds of the call; ``prefill_seconds``: of its prefill (the uncached prompt tokens).
        reused_tokens: prompt tokens a caller's cache already held.
        target_forwards: full-cache verification forwards, the prefill excluded (batched forwards for a batch).
        decoded_tokens: tokens those forwards produced (:attr:`mean_accepted_length` per forward).
        retrieval_refreshes: re-selections of level 1's retrieval view.
        tree_rounds: rounds whose level-1 drafts were a token tree (``TriForceConfig.tree_budget``).
        tree_nodes: those trees' nodes, the root included; a tree's level-1 verdict counts the nodes judged on the
            way down from the root as drafted.
        positional_acceptance: one sequence's level-1 candidates by 0-based rank ``k``: ``trials[k]`` offered,
            ``accepted[k]`` taken (greedy chains count a rejection at the verifier's token's rank, up to 8).
        full_cache_bytes: key/value bytes of the full cache; ``view_bytes``: of the largest retrieval view;
            ``draft_cache_bytes``: of the level-0 draft cache.
        kv_bytes_to_device: with ``TriForceConfig.offload_kv``, key/value bytes copied to the device (the prefill
            included); ``kv_bytes_to_host``: copied back.
        level1_weights: what level 1 drafted with: ``"full"``, ``"int4"`` or ``"int8"``.
        level1_forward: the forward that ran them: ``"direct"`` or ``"transformers"``.
        level0: level-0 drafts judged by level 1 (a :class:`LevelStats`).
        level1: level-1 drafts judged by the full cache (level 2).
        level0_to_level2: level-0 drafts judged by level 2 directly (rounds that skip level 1).
        rounds: rounds per schedule: ``"levels"``, ``"level0"``, ``"plain"`` (:mod:`~hf_triforce.hierarchy.planner`).
        planner: what the schedule's planner weighed and why it settled where it did (JSON-ready, bounded size; see
            :meth:`~hf_triforce.hierarchy.planner.Planner.explain`; :attr:`schedule_summary` reads it out); empty
            for a batch's rows.
        phases: times of ``level0``, ``level1``, ``refresh``, ``level2``, ``prefill``, ``reuse`` (a caller's cache).
        rows: a batched call's per-row stats, in batch order (the top-level figures are the batch's totals).

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
    level0: LevelStats = field(default_factory=LevelStats)
    level1: LevelStats = field(default_factory=LevelStats)
    level0_to_level2: LevelStats = field(default_factory=LevelStats)
    rounds: dict[str, int] = field(default_factory=dict)
    planner: dict[str, Any] = field(default_factory=dict)
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    rows: list[TriForceStats] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per full-cache verification forward."""
        return self.decoded_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second after the prefill (its first token excluded): the decoding speed, prompt length apart.

        Example:
            >>> TriForceStats(seconds=3.0, prefill_seconds=1.0, decoded_tokens=40).decode_tokens_per_second
            20.0
        """
        decoding = self.seconds - self.prefill_seconds
        return self.decoded_tokens / decoding if decoding > 0 else 0.0

    @property
    def schedule_summary(self) -> str:
        """:attr:`planner` in two lines: each schedule's rounds and milliseconds per token, measured over its timed
        rounds (modeled at the latest decision), the switches and probes; then why the call settled where it did
        (``""``: no record, as for a batch's rows).

        Example:
            >>> plain = {"rounds": 3, "measured_ms_per_token": 10.4, "modeled_ms_per_token": 10.0}
            >>> levels = {"rounds": 30, "measured_ms_per_token": 4.1, "modeled_ms_per_token": 3.9, "gamma2": 6}
            >>> record = {"schedules": {"levels": levels, "plain": plain}, "switches": 1, "probes": 2,
            ...           "reason": "levels (gamma2 6, chain): modeled 3.9 ms/token vs plain 10 ms/token"}
            >>> print(TriForceStats(planner=record).schedule_summary)
            schedule: levels 30 rounds 4.1 ms/token (modeled 3.9), plain 3 rounds 10.4 (10); 1 switch, 2 probes
            why: levels (gamma2 6, chain): modeled 3.9 ms/token vs plain 10 ms/token
        """
        if not self.planner:
            return ""
        parts = []
        for i, (kind, entry) in enumerate(self.planner["schedules"].items()):
            measured, modeled = ms_text(entry.get("measured_ms_per_token")), ms_text(entry.get("modeled_ms_per_token"))
            unit = " ms/token (modeled " if i == 0 else " ("
            parts.append(f"{kind} {entry['rounds']} rounds {measured}{unit}{modeled})")
        switches, probes = self.planner["switches"], self.planner["probes"]
        counts = f"{switches} switch{'es' * (switches != 1)}, {probes} probe{'s' * (probes != 1)}"
        return f"schedule: {', '.join(parts)}; {counts}\nwhy: {self.planner['reason']}"

    def __repr__(self) -> str:
        """One line: tokens, speed, tokens per verification, each level's per-token acceptance, level 1's weights
        (``print(last_stats(model))``); :meth:`to_dict` has every figure and timing.

        Example:
            >>> stats = TriForceStats(new_tokens=48, seconds=3.0, prefill_seconds=1.0, decoded_tokens=47,
            ...                       target_forwards=15, level1_weights="int4", level1_forward="direct")
            >>> stats.level0.record(20, 9); stats.level1.record(50, 44)
            >>> stats  # doctest: +NORMALIZE_WHITESPACE
            TriForceStats(new_tokens=48, decode_tokens_per_second=23.5, tokens_per_verification=3.13,
                          per_token_acceptance={level0: 0.90, level1: 0.98}, level1='int4 weights, direct forward';
                          to_dict() for every figure)
        """
        levels = ", ".join(f"{name}: {getattr(self, name).per_token_acceptance:.2f}" for name in ("level0", "level1"))
        rows = f", rows={len(self.rows)}" if self.rows else ""
        return (
            f"TriForceStats(new_tokens={self.new_tokens}, "
            f"decode_tokens_per_second={self.decode_tokens_per_second:.1f}, "
            f"tokens_per_verification={self.mean_accepted_length:.2f}, per_token_acceptance={{{levels}}}, "
            f"level1='{self.level1_weights} weights, {self.level1_forward} forward'{rows}; to_dict() for every figure)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (JSON-serializable)."""
        skip = ("level0", "level1", "level0_to_level2", "phases", "rows")  # each converted below
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        out["mean_accepted_length"] = self.mean_accepted_length
        out["decode_tokens_per_second"] = self.decode_tokens_per_second
        out["levels"] = {level: getattr(self, level).to_dict() for level in ("level0", "level1", "level0_to_level2")}
        out["phases"] = self.phases.to_dict()
        if self.rows:
            out["rows"] = [row.to_dict() for row in self.rows]
        return out
