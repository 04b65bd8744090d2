"""Per-call statistics of a TriForce ``generate()``: tokens, time, forwards and per-level acceptance.

One vocabulary names the three levels everywhere (stats, phases, docs, CLI output):

* ``level0``: the drafter (n-gram lookup or a tiny model with a StreamingLLM cache);
* ``level1``: the target's weights over the retrieval view (a ``retrieval_budget``-token sparse KV cache);
* ``level2``: the target with its full KV cache, whose output is the output.

``levels["level0"]`` counts level-0 drafts judged by level 1, ``levels["level1"]`` level-1 drafts judged by
level 2. The names of hf_triforce 0.1 (``levels["draft"]``/``["retrieval"]``, phases ``"draft"``/``"verify"``,
``stats.draft``/``stats.retrieval``) still resolve, with a ``FutureWarning``, until 0.3.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

LEVEL_ALIASES = {"draft": "level0", "retrieval": "level1"}
"""Renamed ``levels`` keys (0.1 name -> name), resolved with a ``FutureWarning`` until 0.3."""
PHASE_ALIASES = {"draft": "level0", "verify": "level2"}
"""Renamed ``phases`` keys (0.1 name -> name), resolved with a ``FutureWarning`` until 0.3."""


def _renamed(old: str, new: str, where: str) -> None:
    warnings.warn(
        f"TriForce stats: {where} {old!r} is now {new!r}; the old name is removed in hf_triforce 0.3.",
        FutureWarning,
        stacklevel=3,
    )


class AliasedDict(dict):
    """A dict in which renamed keys still resolve (``d[old]``, ``d.get(old)``) with a ``FutureWarning``.

    Only the new keys are stored, so iteration and JSON show the new vocabulary alone.

    Example:
        >>> d = AliasedDict({"level1": 3}, {"retrieval": "level1"}, "levels key")
        >>> list(d), d["level1"]
        (['level1'], 3)
    """

    def __init__(self, data: Any = (), aliases: dict[str, str] | None = None, what: str = "key") -> None:
        super().__init__(data)
        self.aliases, self.what = aliases or {}, what

    def __missing__(self, key: str) -> Any:
        if key not in self.aliases:
            raise KeyError(key)
        _renamed(key, self.aliases[key], self.what)
        return self[self.aliases[key]]

    def get(self, key: str, default: Any = None) -> Any:
        if key in self or key not in getattr(self, "aliases", {}):
            return super().get(key, default)
        _renamed(key, self.aliases[key], self.what)
        return super().get(self.aliases[key], default)


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
        phases = {
            k: {"seconds": v, "calls": self.calls[k], "ms_per_call": 1e3 * v / self.calls[k]}
            for k, v in self.seconds.items()
        }
        return AliasedDict(phases, PHASE_ALIASES, "phase")


@dataclass
class TriForceStats:
    """What one TriForce ``generate()`` call did.

    ``level0`` counts level-0 drafts judged by level 1; ``level1`` counts level-1 drafts judged by the full
    cache (level 2); ``level0_to_level2`` counts level-0 drafts judged by level 2 directly (rounds that skip
    level 1). ``rounds`` counts the rounds of each schedule the planner chose (``"levels"``: level 0 -> 1 -> 2,
    ``"level0"``: level 0 -> 2, ``"plain"``: a plain decoding step; see :mod:`hf_triforce.hierarchy.planner`).
    ``target_forwards`` counts full-cache verification forwards (the prefill excluded) and
    ``mean_accepted_length`` is the mean number of tokens each of them produced. ``phases`` times the level-0
    drafts (``level0``), the level-1 forwards (``level1``), retrieval re-selections (``refresh``), the
    full-cache verifications (``level2``), the ``prefill`` (of the uncached prompt tokens) and ``reuse`` (starting
    from a caller's cache and handing it back). ``reused_tokens`` counts the prompt tokens a caller's cache
    already held. ``*_bytes`` are the key/value bytes allocated by the full cache, the largest retrieval view,
    and the level-0 draft cache.

    Example:
        >>> stats = TriForceStats(); stats.level1.record(6, 5); stats.to_dict()["levels"]["level1"]
        {'drafted': 6, 'accepted': 5, 'acceptance_rate': 0.8333333333333334}
    """

    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    reused_tokens: int = 0
    target_forwards: int = 0
    decoded_tokens: int = 0
    retrieval_refreshes: int = 0
    full_cache_bytes: int = 0
    view_bytes: int = 0
    draft_cache_bytes: int = 0
    level0: LevelStats = field(default_factory=LevelStats)
    level1: LevelStats = field(default_factory=LevelStats)
    level0_to_level2: LevelStats = field(default_factory=LevelStats)
    rounds: dict[str, int] = field(default_factory=dict)
    phases: PhaseTimes = field(default_factory=PhaseTimes)

    @property
    def draft(self) -> LevelStats:
        """Deprecated name of :attr:`level0` (removed in 0.3)."""
        _renamed("draft", "level0", "attribute")
        return self.level0

    @property
    def retrieval(self) -> LevelStats:
        """Deprecated name of :attr:`level1` (removed in 0.3)."""
        _renamed("retrieval", "level1", "attribute")
        return self.level1

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per full-cache verification forward."""
        return self.decoded_tokens / self.target_forwards if self.target_forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (JSON-serializable)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("level0", "level1", "level0_to_level2", "phases")}
        out["mean_accepted_length"] = self.mean_accepted_length
        levels = {"level0": self.level0.to_dict(), "level1": self.level1.to_dict()}
        levels["level0_to_level2"] = self.level0_to_level2.to_dict()
        out["levels"] = AliasedDict(levels, LEVEL_ALIASES, "levels key")
        out["phases"] = self.phases.to_dict()
        return out


def upgrade_stats_dicts(data: Any) -> Any:
    """Rename hf_triforce 0.1 keys in every stats dict inside ``data`` (recorded results, in place) and return it.

    A stats dict is one with ``"levels"`` and ``"phases"`` (``TriForceStats.to_dict()``); files written by 0.1
    name the levels ``draft``/``retrieval`` and the phases ``draft``/``verify``.

    Example:
        >>> upgrade_stats_dicts({"run": {"levels": {"retrieval": 1}, "phases": {"verify": 2}}})
        {'run': {'levels': {'level1': 1}, 'phases': {'level2': 2}}}
    """
    if isinstance(data, list):
        for item in data:
            upgrade_stats_dicts(item)
    elif isinstance(data, dict):
        if isinstance(data.get("levels"), dict) and isinstance(data.get("phases"), dict):
            for key, aliases in (("levels", LEVEL_ALIASES), ("phases", PHASE_ALIASES)):
                data[key] = {aliases.get(k, k): v for k, v in data[key].items()}
        for value in data.values():
            upgrade_stats_dicts(value)
    return data
