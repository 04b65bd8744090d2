"""When each level works: the level-0 gate (draft or not) and the level-1 re-selection rule.

Both are lossless by construction: they only decide *what is drafted* and *which tokens level 1 sees*, never
what is accepted.
"""

from __future__ import annotations

from ..config import TriForceConfig

PROBE_EVERY = 8  # level-1 steps between level-0 drafts while level 0 is paused
RATE_SMOOTHING = 0.1  # weight of the newest level-1 step in level 0's running acceptance rate


class Level0Gate:
    """Pauses level-0 drafting while its running acceptance is below ``floor``, probing every ``PROBE_EVERY`` steps.

    A rejected level-0 draft still costs level 1 a wider forward; a drafter that keeps missing (n-gram lookup on
    text that does not repeat) is better left out until it starts matching again.

    Example:
        >>> gate = Level0Gate(floor=0.5)
        >>> gate.should_draft(), gate.record(drafted=4, accepted=0), round(gate.rate, 2)
        (True, None, 0.9)
    """

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self.rate = 1.0
        self._steps_since_draft = 0

    def should_draft(self) -> bool:
        """Whether this level-1 step should ask level 0 for drafts."""
        self._steps_since_draft += 1
        if self.rate >= self.floor or self._steps_since_draft >= PROBE_EVERY:
            self._steps_since_draft = 0
            return True
        return False

    def record(self, drafted: int, accepted: int) -> None:
        """Fold one level-1 step's verdict on ``drafted`` level-0 tokens into the running rate."""
        if drafted:
            self.rate += RATE_SMOOTHING * (accepted / drafted - self.rate)


class RefreshRule:
    """When level 1 re-selects its retrieval chunks: every ``refresh_every`` new tokens, and (optionally) after a
    round whose level-1 acceptance fell below ``refresh_below_acceptance``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():  # refresh_below_acceptance is deprecated (removed in 0.3)
        ...     warnings.simplefilter("ignore", FutureWarning)
        ...     rule = RefreshRule(TriForceConfig(refresh_every=4, refresh_below_acceptance=0.5))
        >>> rule.due(tokens_since_selection=2), rule.observe(drafted=6, accepted=1), rule.due(2)
        (False, None, True)
    """

    def __init__(self, config: TriForceConfig) -> None:
        self.every, self.below = config.refresh_every, config.refresh_below_acceptance
        self._forced = False

    def due(self, tokens_since_selection: int | None) -> bool:
        """Whether to re-select now (``None``: no selection yet)."""
        return tokens_since_selection is None or tokens_since_selection >= self.every or self._forced

    def observe(self, drafted: int, accepted: int) -> None:
        """Record a round's level-1 verdict (``accepted`` of ``drafted``)."""
        if self.below is not None and drafted and accepted / drafted < self.below:
            self._forced = True

    def selected(self) -> None:
        """A selection was made."""
        self._forced = False
