"""Per-call statistics of a TriForce ``generate()``: tokens, time, forwards and per-level acceptance."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class LevelStats:
    """Drafted and accepted token counts for one verification level."""

    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """``accepted / drafted`` (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def to_dict(self) -> dict[str, Any]:
        return {"drafted": self.drafted, "accepted": self.accepted, "acceptance_rate": self.acceptance_rate}


@dataclass
class PhaseTimes:
    """Wall-clock seconds and calls per phase of a TriForce call.

    On a GPU each phase ends with a device synchronization, so its time is the device's, not the launch
    time (the decode loop synchronizes after every level-1 step and verification anyway, to read the
    accepted tokens).
    """

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

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
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
            self.calls[phase] = self.calls.get(phase, 0) + 1

    def to_dict(self) -> dict[str, dict[str, float]]:
        """``{phase: {"seconds": total, "calls": n, "ms_per_call": mean}}``."""
        return {
            k: {"seconds": v, "calls": self.calls[k], "ms_per_call": 1e3 * v / self.calls[k]}
            for k, v in self.seconds.items()
        }


@dataclass
class TriForceStats:
    """What one TriForce ``generate()`` call did.

    ``levels["draft"]`` counts level-0 drafts verified by level 1; ``levels["retrieval"]`` counts
    level-1 drafts verified by the full cache. ``target_forwards`` counts full-cache verification
    forwards (the prefill excluded) and ``mean_accepted_length`` is the mean number of tokens each of
    them produced. ``phases`` times the level-0 drafts (``draft``), level-1 forwards (``level1``),
    retrieval refreshes (``refresh``), full-cache verifications (``verify``) and the ``prefill``.
    ``*_bytes`` are the key/value bytes allocated by the full cache, the largest retrieval view, and
    the level-0 draft cache.

    Example:
        >>> stats = TriForceStats(); stats.retrieval.record(6, 5); stats.to_dict()["levels"]["retrieval"]
        {'drafted': 6, 'accepted': 5, 'acceptance_rate': 0.8333333333333334}
    """

    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    target_forwards: int = 0
    decoded_tokens: int = 0
    retrieval_refreshes: int = 0
    full_cache_bytes: int = 0
    view_bytes: int = 0
    draft_cache_bytes: int = 0
    draft: LevelStats = field(default_factory=LevelStats)
    retrieval: LevelStats = field(default_factory=LevelStats)
    phases: PhaseTimes = field(default_factory=PhaseTimes)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per full-cache verification forward."""
        return self.decoded_tokens / self.target_forwards if self.target_forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (JSON-serializable)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("draft", "retrieval", "phases")}
        out["mean_accepted_length"] = self.mean_accepted_length
        out["levels"] = {"draft": self.draft.to_dict(), "retrieval": self.retrieval.to_dict()}
        out["phases"] = self.phases.to_dict()
        return out
