"""What a decoding call measures about itself: per-token acceptance of each level, and forward cost by width.

The planner (:mod:`~hf_triforce.hierarchy.planner`) values a drafted token at its acceptance probability
(:class:`Acceptance`, :class:`StreakAcceptance`, :class:`ConfidenceAcceptance`) and a forward at what forwards of its
width have cost so far in this call (:class:`StepCost`).
"""

from __future__ import annotations

FORGET = 0.9  # weight of the past at each newly judged token (about the last ten tokens count)
SLOW_FORGET = 0.98
"""The same for :class:`StreakAcceptance`'s call-long rate (about the last fifty judged tokens count)."""
WINDOW = 4
"""How many of a width's latest forwards :class:`StepCost` keeps (it estimates with their minimum)."""
MIN_SECONDS = 1e-7
"""The floor of every estimate: a clock too coarse for a fast step, or an extrapolation below zero, is not free."""
PRIOR_SLOPE = 0.1  # extra cost of one more query token, relative to the measured width, before two are measured


def expected_tokens(acceptance: float, drafts: int) -> float:
    """Tokens one verification yields for ``drafts`` drafted tokens accepted one after another with probability
    ``acceptance``: the accepted prefix plus the verifier's own token, ``sum_{i=0..drafts} acceptance**i``.

    Example:
        >>> expected_tokens(0.5, 2), expected_tokens(1.0, 3), expected_tokens(0.9, 0)
        (1.75, 4.0, 1.0)
    """
    return sum(acceptance**i for i in range(drafts + 1))


class Acceptance:
    """Running per-token acceptance of one level's drafts (the TriForce paper's), from verdicts "``accepted`` leading
    tokens of ``drafted``": each accepted token a success, a rejection one failure (later tokens were never judged);
    the past fades by ``forget`` per token judged since. ``prior`` counts for ``weight`` judged tokens.

    Example:
        >>> a = Acceptance(prior=0.5, weight=1.0)
        >>> a.observe(drafted=4, accepted=4); round(a.rate, 3)  # four judged tokens: the prior fades by 0.9 ** 4
        0.93
        >>> a.observe(drafted=4, accepted=0); round(a.rate, 3)  # one judged token (the rejected one)
        0.75
    """

    def __init__(self, prior: float = 0.8, weight: float = 2.0, forget: float = FORGET) -> None:
        self.successes, self.failures = prior * weight, (1.0 - prior) * weight
        self.forget = forget
        self.verdicts = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """Fold in one verdict: ``accepted`` leading tokens of ``drafted`` (nothing when nothing was drafted)."""
        if drafted <= 0:
            return
        rejected = 1.0 if accepted < drafted else 0.0
        fade = self.forget ** (accepted + rejected)  # the past fades by the tokens judged since
        self.successes = fade * self.successes + accepted
        self.failures = fade * self.failures + rejected
        self.verdicts += 1

    @property
    def rate(self) -> float:
        """The estimated probability of accepting one more drafted token."""
        return self.successes / (self.successes + self.failures)


class StreakAcceptance:
    """Per-token acceptance conditioned on the previous verdict, all accepted or a rejection (a two-state Markov
    estimate); :attr:`rate` is the current state's. Rounds the level sits out (:meth:`idle`) fade it toward the
    call-long :attr:`overall`, so one early rejection cannot keep the level out of the schedule until the next probe.

    Example:
        >>> a = StreakAcceptance(prior=0.8, weight=1.0)
        >>> for _ in range(3): a.observe(drafted=2, accepted=0)
        >>> a.observe(drafted=1, accepted=1); a.observe(drafted=4, accepted=4)
        >>> round(a.rate, 3), round(a.after[False].rate, 3)  # after a full acceptance, after a rejection
        (0.852, 0.46)
        >>> a.observe(drafted=4, accepted=0); a.idle(tokens=10)  # a rejection, then ten tokens decided without it
        >>> round(a.after[False].rate, 3), round(a.rate, 3), round(a.overall.rate, 3)
        (0.46, 0.547, 0.593)
    """

    def __init__(self, prior: float = 0.8, weight: float = 2.0) -> None:
        self.after = {True: Acceptance(prior, weight), False: Acceptance(prior, weight)}
        self.overall = Acceptance(prior, weight, forget=SLOW_FORGET)  # every verdict, a longer memory
        self.last_full = True
        self.idle_tokens = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """Fold ``accepted`` of ``drafted`` into the estimate of the state the verdict followed."""
        if drafted <= 0:
            return
        self.after[self.last_full].observe(drafted, accepted)
        self.overall.observe(drafted, accepted)
        self.last_full = accepted >= drafted
        self.idle_tokens = 0

    def idle(self, tokens: int) -> None:
        """``tokens`` were decided by a round this level took no part in."""
        self.idle_tokens += tokens

    @property
    def verdicts(self) -> int:
        return self.overall.verdicts

    @property
    def rate(self) -> float:
        """The estimated probability of accepting one more drafted token, given the previous verdict."""
        conditioned = FORGET**self.idle_tokens
        return conditioned * self.after[self.last_full].rate + (1.0 - conditioned) * self.overall.rate


CONFIDENCE_EDGES = (0.5, 0.8, 0.95, 0.99)
"""Bucket boundaries of :class:`ConfidenceAcceptance` (a token's probability under its drafter)."""
CONFIDENCE_PRIORS = (0.8, 0.85, 0.9, 0.95, 0.99)
"""Each bucket's acceptance before any verdict."""


class ConfidenceAcceptance:
    """Per-token acceptance by the drafter's confidence in the token: one :class:`Acceptance` per bucket of
    :data:`CONFIDENCE_EDGES`.

    Example:
        >>> a = ConfidenceAcceptance()
        >>> a.rate(0.3), a.rate(0.995)  # the priors
        (0.8, 0.99)
        >>> a.observe([0.999, 0.3, 0.6], accepted=1)  # the first accepted, the second rejected, the third unjudged
        >>> round(a.rate(0.999), 3), round(a.rate(0.3), 3), a.rate(0.6)
        (0.994, 0.514, 0.85)
    """

    def __init__(self, weight: float = 2.0) -> None:
        self.buckets = [Acceptance(prior, weight) for prior in CONFIDENCE_PRIORS]

    def _bucket(self, confidence: float) -> Acceptance:
        return self.buckets[sum(confidence >= edge for edge in CONFIDENCE_EDGES)]

    def observe(self, confidences: list[float], accepted: int) -> None:
        """Fold in one verdict on drafts of ``confidences``: the first ``accepted`` accepted, the next one (if any)
        rejected; the ones after it were never judged."""
        for i, confidence in enumerate(confidences[: accepted + 1]):
            self._bucket(confidence).observe(1, int(i < accepted))

    def rate(self, confidence: float) -> float:
        """The estimated probability that a drafted token of this ``confidence`` is accepted."""
        return self._bucket(confidence).rate


class RunningRate:
    """Tokens per second over the latest rounds, older ones fading by :data:`FORGET` per token since.

    Example:
        >>> r = RunningRate(); r.rate is None
        True
        >>> r.observe(tokens=4, seconds=0.2); r.observe(tokens=1, seconds=0.1); round(r.rate, 2)
        16.43
    """

    def __init__(self) -> None:
        self.tokens, self.seconds = 0.0, 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Fold in one round that gave ``tokens`` in ``seconds``."""
        fade = FORGET**tokens
        self.tokens, self.seconds = fade * self.tokens + tokens, fade * self.seconds + seconds

    @property
    def rate(self) -> float | None:
        """Tokens per second (``None`` before any round)."""
        return self.tokens / self.seconds if self.seconds > 0 else None


class StepCost:
    """Seconds of one forward by query width: the fastest of a width's last :data:`WINDOW` forwards (a call's first
    forwards pay one-time costs a mean would carry); a width between two measured ones on the line between them (so
    measuring a wide width changes no narrower estimate), beyond the measured ones by the affine fit's slope.

    Example:
        >>> cost = StepCost()
        >>> cost.observe(1, 0.030); cost.observe(7, 0.060)
        >>> round(cost(4), 4), round(cost(7), 4), round(cost(9), 4)
        (0.045, 0.06, 0.07)
        >>> StepCost()(3) is None
        True
    """

    def __init__(self) -> None:
        self.fastest: dict[int, float] = {}  # width -> the fastest of its latest WINDOW forwards
        self._recent: dict[int, list[float]] = {}

    def observe(self, width: int, seconds: float) -> None:
        """Fold in one forward of ``width`` query tokens that took ``seconds``."""
        recent = self._recent.setdefault(width, [])
        recent.append(seconds)
        del recent[:-WINDOW]
        self.fastest[width] = min(recent)

    @property
    def known(self) -> bool:
        return bool(self.fastest)

    def __call__(self, width: int) -> float | None:
        """The estimated seconds of a ``width``-token forward (``None`` before any measurement)."""
        if width in self.fastest or not self.fastest:
            estimate = self.fastest.get(width)
        elif len(self.fastest) == 1:
            ((w0, c0),) = self.fastest.items()
            estimate = c0 * max(0.1, 1.0 + PRIOR_SLOPE * (width - w0))
        else:
            estimate = self._between(width)
        return None if estimate is None else max(MIN_SECONDS, estimate)

    def _between(self, width: int) -> float:
        """The line between the measured widths around ``width``; outside them, the nearest one's cost and the fit's
        slope."""
        widths = sorted(self.fastest)
        below, above = [w for w in widths if w < width], [w for w in widths if w > width]
        if below and above:
            w0, w1 = below[-1], above[0]
            c0, c1 = self.fastest[w0], self.fastest[w1]
            return c0 + (c1 - c0) * (width - w0) / (w1 - w0)
        nearest = below[-1] if below else above[0]
        return self.fastest[nearest] + max(self._fit()[2], 0.0) * (width - nearest)

    def slope(self) -> float | None:
        """Seconds one more query token adds to a forward: the affine fit's slope through the measured widths,
        :data:`PRIOR_SLOPE` of the one measured width's cost, or ``None`` before any measurement.

        Example:
            >>> cost = StepCost(); cost.observe(1, 0.030); cost.observe(4, 0.036); cost.observe(7, 0.060)
            >>> round(cost.slope(), 4)
            0.005
        """
        if not self.fastest:
            return None
        if len(self.fastest) == 1:
            return PRIOR_SLOPE * max(MIN_SECONDS, *self.fastest.values())
        return max(0.0, self._fit()[2])

    def _fit(self) -> tuple[float, float, float]:
        """``(mean width, mean cost, slope)`` of the least-squares line through the measured widths."""
        widths, costs = list(self.fastest), list(self.fastest.values())
        n = len(widths)
        mean_w, mean_c = sum(widths) / n, sum(costs) / n
        var = sum((w - mean_w) ** 2 for w in widths)
        slope = sum((w - mean_w) * (c - mean_c) for w, c in zip(widths, costs, strict=True)) / var
        return mean_w, mean_c, slope
