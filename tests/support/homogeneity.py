"""Pearson's chi-square test of homogeneity for two samples of token continuations, as the sampling tests use it.

A continuation of ``length`` tokens over a ``vocab``-token vocabulary is coded as one base-``vocab`` number; the
test compares the two samples' counts of each code (``scipy.stats.chi2_contingency`` on the 2 x K table), pooling
the continuations too rare for the chi-square approximation (expected count below :data:`MIN_EXPECTED`).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2_contingency

MIN_EXPECTED = 5
"""Continuations with an expected count below this are pooled into one bin (the usual chi-square rule)."""


def window_codes(tokens: np.ndarray, window: tuple[int, ...], vocab: int) -> np.ndarray:
    """``[N]`` continuation codes of ``[N, T]`` new tokens: the tokens at ``window``'s positions read as a
    base-``vocab`` number (what :func:`homogeneity_test` compares).

    Example:
        >>> window_codes(np.array([[1, 2, 3, 4]]), (1, 3), vocab=8).tolist()  # 2 + 4 * 8
        [34]
    """
    return (np.asarray(tokens)[:, list(window)] * vocab ** np.arange(len(window))).sum(axis=1)


def homogeneity_test(
    first: np.ndarray, second: np.ndarray, vocab: int, length: int
) -> tuple[float, np.ndarray, list[str]]:
    """Chi-square test that two samples of continuation codes (``length`` tokens of ``vocab``) come from one
    distribution.

    Returns:
        ``(p_value, table, labels)``: the ``2 x K`` table of counts that was tested (bins by decreasing
        total count, the pooled rare continuations last) and a label per column.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> p, table, _ = homogeneity_test(rng.integers(0, 4, 400), rng.integers(0, 4, 400), vocab=4, length=1)
        >>> table.shape, p > 1e-3
        ((2, 4), True)
    """
    bins = vocab**length
    counts = np.stack([np.bincount(first, minlength=bins), np.bincount(second, minlength=bins)])
    totals = counts.sum(axis=0)
    expected = totals * counts.sum(axis=1).min() / totals.sum()  # the smaller of the two rows' expected counts
    order = np.argsort(-totals, kind="stable")
    kept = [b for b in order if expected[b] >= MIN_EXPECTED]
    pooled = [b for b in order if 0 < expected[b] < MIN_EXPECTED]
    table = counts[:, kept]
    labels = [str(tuple(int(b) // vocab**i % vocab for i in range(length))) for b in kept]
    if pooled:
        rest = counts[:, pooled].sum(axis=1, keepdims=True)
        if expected[pooled].sum() >= MIN_EXPECTED or not kept:
            table = np.concatenate([table, rest], axis=1)
            labels.append(f"{len(pooled)} rare continuations")
        else:  # too rare even pooled: fold them into the rarest kept bin
            table[:, -1:] += rest
            labels[-1] += f" + {len(pooled)} rare"
    assert table.shape[1] >= 2, f"degenerate histogram: {dict(zip(labels, table.T.tolist(), strict=True))}"
    return float(chi2_contingency(table)[1]), table, labels


def describe(table: np.ndarray, labels: list[str], names: tuple[str, str]) -> str:
    """The tested table as text, one continuation a line, for a failure message."""
    width = max(len(label) for label in labels)
    rows = [f"{'continuation':>{width}} {names[0]:>10} {names[1]:>10}"]
    rows += [f"{label:>{width}} {a:>10} {b:>10}" for label, (a, b) in zip(labels, table.T.tolist(), strict=True)]
    return "\n".join(rows)
