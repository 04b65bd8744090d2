"""The shape of a token tree, from data: Sequoia's dynamic program over a positional acceptance vector.

Level 1 drafts a tree instead of a chain where a wide verification costs little more than a narrow one (Sequoia,
Chen et al. 2024): where its first choice is wrong its second is often right. With ``p_k`` the chance that a node's
``k``-th candidate is the one accepted (the *positional acceptance vector*, :class:`PositionalAcceptance`), a tree
yields the sum over its nodes of the chance of reaching each; :func:`best_tree` finds the best :class:`TreeShape`.

Example:
    >>> shape = best_tree([0.6, 0.3], size=4, depth=2)
    >>> shape.parents, round(shape.expected_tokens, 3)  # two candidates at the root, the first with a child
    ([-1, 0, 0, 1], 2.26)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError

MAX_BRANCH = 8
"""The most candidates a node may have (later ranks are rarely accepted; the program's cost grows with it)."""


@dataclass(frozen=True)
class TreeShape:
    """A token tree's shape: ``parents[i]`` is node ``i``'s parent (``-1`` for the root, node 0), nodes in
    breadth-first order, a node's children in rank order; ``expected_tokens`` under the vector it was built for.

    Example:
        >>> TreeShape([-1, 0, 1], 2.0).depths, TreeShape([-1, 0, 1], 2.0).children
        ([0, 1, 2], [[1], [2], []])
    """

    parents: list[int]
    expected_tokens: float

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        depths = [0] * self.size
        for i, parent in enumerate(self.parents[1:], start=1):
            depths[i] = depths[parent] + 1
        return depths

    @property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, parent in enumerate(self.parents[1:], start=1):
            kids[parent].append(i)
        return kids

    @property
    def depth(self) -> int:
        return max(self.depths)

    def is_chain(self) -> bool:
        return all(len(kids) <= 1 for kids in self.children)


def chain(length: int, acceptance: list[float]) -> TreeShape:
    """A chain of ``length`` drafts after the root, as a :class:`TreeShape`.

    Example:
        >>> chain(2, [0.5]).parents, chain(2, [0.5]).expected_tokens
        ([-1, 0, 1], 1.75)
    """
    p = acceptance[0] if acceptance else 0.0
    return TreeShape([-1, *range(length)], sum(p**i for i in range(length + 1)))


def best_tree(acceptance: list[float], size: int, depth: int) -> TreeShape:
    """The tree of at most ``size`` nodes (the root included) and depth at most ``depth`` with the most expected
    tokens per verification, for ``acceptance`` ``[p_1, p_2, ...]`` (at most :data:`MAX_BRANCH` used).

    ``F(n, d) = 1 + G(n - 1, d - 1, 1)`` is the best tree of ``n`` nodes and depth ``d``, ``G(m, d, k)`` the best
    split of ``m`` nodes into subtrees under the candidates of ranks ``k, k + 1, ...``:
    ``G(m, d, k) = max(0, max_j p_k F(j, d) + G(m - j, d, k + 1))`` (Sequoia's recurrence).

    Example:
        >>> best_tree([0.9], size=4, depth=8).parents  # one candidate per node: a chain
        [-1, 0, 1, 2]
        >>> best_tree([0.6, 0.3], size=3, depth=1).parents  # depth 1: candidates side by side
        [-1, 0, 0]
    """
    return best_trees(acceptance, [size], depth)[0]


def best_trees(acceptance: list[float], sizes: list[int], depth: int) -> list[TreeShape]:
    """:func:`best_tree` for each of ``sizes`` from one run of the program (the vector rounded to 2 decimals, so that
    rounds that measured about the same reuse a cached run: a 64-node run takes milliseconds).

    Example:
        >>> [t.size for t in best_trees([0.6, 0.3], [2, 4], depth=2)]
        [2, 4]
    """
    p = tuple(round(float(a), 2) for a in acceptance[:MAX_BRANCH])
    if min(sizes) < 1 or depth < 0:
        raise InvalidInputError(f"best_tree needs sizes >= 1 and depth >= 0, got sizes={sizes}, depth={depth}.")
    splits, best = _program(p, max(sizes), depth)
    return [TreeShape(_breadth_first(splits, size, depth), best[(size, depth)]) for size in sizes]


@functools.lru_cache(maxsize=64)
def _program(p: tuple[float, ...], size: int, depth: int):
    """Sequoia's program up to ``size`` nodes and ``depth``: ``splits[(n, d)]`` (subtree size per rank) and
    ``best[(n, d)]``."""
    best = {(n, 0): 1.0 for n in range(1, size + 1)}
    splits: dict[tuple[int, int], tuple[int, ...]] = {(n, 0): () for n in range(1, size + 1)}
    for d in range(1, depth + 1):
        table, choice = _split_table(p, size - 1, [0.0] + [best[(j, d - 1)] for j in range(1, size)])
        for n in range(1, size + 1):
            best[(n, d)], splits[(n, d)] = 1.0 + table[0][n - 1], _parts(choice, n - 1)
    return splits, best


def _split_table(p: tuple[float, ...], m: int, subtree: list[float]):
    """``table[k][r]``: ``G(r, ., k)`` of :func:`best_tree` given ``subtree[j]`` (the best of ``j`` nodes);
    ``choice[k][r]``: the size rank ``k`` gets (0: none, which ends the ranks).

    Each rank's row at once over every ``(r, j)`` (``j <= r``), the smallest ``j`` within ``1e-12`` of the best taken:
    a 64-node program in about a millisecond, where loops in Python took 15 ms and ran on most planned rounds (the
    vector moves between rounds, so the cache of :func:`_program` misses)."""
    ranks, gather, valid = len(p), *_split_indices(m)
    sub = np.asarray(subtree, dtype=np.float64)
    table, choice = np.zeros((ranks + 1, m + 1)), np.zeros((ranks + 1, m + 1), dtype=np.int64)
    for k in range(ranks - 1, -1, -1):
        values = np.where(valid, p[k] * sub[None, :] + table[k + 1][gather], -np.inf)
        top = values.max(axis=1)
        first = (values >= top[:, None] - 1e-12).argmax(axis=1)
        taken = top > 1e-12  # a rank gets nodes only where they add something (else the ranks end)
        table[k], choice[k] = np.where(taken, top, 0.0), np.where(taken, first, 0)
    return table.tolist(), choice.tolist()


@functools.lru_cache(maxsize=8)
def _split_indices(m: int) -> tuple[np.ndarray, np.ndarray]:
    """``[m + 1, m + 1]`` the index ``r - j`` (clamped at 0) and whether ``1 <= j <= r``, for :func:`_split_table`."""
    r, j = np.arange(m + 1)[:, None], np.arange(m + 1)[None, :]
    return np.clip(r - j, 0, None), (j >= 1) & (j <= r)


def _parts(choice: list[list[int]], m: int) -> tuple[int, ...]:
    """The subtree sizes, rank by rank, of the best split of ``m`` nodes (:func:`_split_table`'s ``choice``)."""
    parts, r = [], m
    for row in choice:
        if not r or not row[r]:
            break
        parts.append(row[r])
        r -= row[r]
    return tuple(parts)


def _breadth_first(splits: dict, size: int, depth: int) -> list[int]:
    """The parents of the best ``(size, depth)`` tree, nodes numbered breadth first (rank order under each node)."""
    parents, frontier = [-1], [(0, size, depth)]
    while frontier:
        nxt = []
        for node, n, d in frontier:
            for part in splits[(n, d)]:
                parents.append(node)
                nxt.append((len(parents) - 1, part, d - 1))
        frontier = nxt
    return parents


class PositionalAcceptance:
    """``p_k``, the chance that a node's ``k``-th candidate is the one accepted, measured during a call.

    A verified node with ``c`` candidates is a trial for ranks ``1..c`` and a success for the rank accepted. The
    estimates shrink toward priors: ``prior_first`` for rank 1, each later rank :attr:`PRIOR_SHARE` of what the
    ranks before it left; ``weight``: how many trials each prior counts for.

    Example:
        >>> acc = PositionalAcceptance(prior_first=0.8)
        >>> acc.observe(candidates=2, rank=1); acc.observe(candidates=1, rank=0)
        >>> [round(p, 3) for p in acc.vector(3)]
        [0.7, 0.272, 0.008]
    """

    PRIOR_SHARE = 0.3  # the prior p_k (k > 1): this share of the mass the ranks before it left

    def __init__(self, prior_first: float = 0.8, weight: float = 4.0) -> None:
        self.prior_first, self.weight = prior_first, weight
        self.trials: list[float] = []
        self.successes: list[float] = []

    def observe(self, candidates: int, rank: int) -> None:
        """A node with ``candidates`` candidates whose candidate of 0-based ``rank`` was accepted (``-1``: none)."""
        while len(self.trials) < candidates:
            self.trials.append(0.0)
            self.successes.append(0.0)
        for k in range(candidates):
            self.trials[k] += 1.0
        if rank >= 0:
            self.successes[rank] += 1.0

    def observe_chain(self, drafted: int, accepted: int, candidates: int = 1, missed: int = -1) -> None:
        """A chain's verdict: ``accepted`` leading drafts of ``drafted``, each node a trial for ``candidates`` ranks
        (one by default); at the rejection, ``missed`` is the rank taken (``-1``: none)."""
        for _ in range(accepted):
            self.observe(candidates, 0)
        if accepted < drafted:
            self.observe(candidates, missed)

    def to_dict(self) -> dict[str, list[float]]:
        """The raw counts per rank (``trials``, ``accepted``): what a call measured, without the priors."""
        return {"trials": list(self.trials), "accepted": list(self.successes)}

    def vector(self, ranks: int) -> list[float]:
        """``[p_1 .. p_ranks]``, the measured rates shrunk toward the priors (their sum is at most 1)."""
        out: list[float] = []
        for k in range(ranks):
            prior = self.prior_first if k == 0 else self.PRIOR_SHARE * max(0.0, 1.0 - sum(out))
            trials, successes = (self.trials[k], self.successes[k]) if k < len(self.trials) else (0.0, 0.0)
            estimate = (successes + self.weight * prior) / (trials + self.weight)
            out.append(min(estimate, max(0.0, 1.0 - sum(out))))
        return out
