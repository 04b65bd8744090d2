"""The shape of a token tree, from data: Sequoia's dynamic program over a positional acceptance vector.

Level 1 drafts a *tree* instead of a chain when the verification of many tokens costs little more than of a few
(Sequoia, Chen et al. 2024): where level 1's first choice is wrong its second or third is often right, and a chain
cannot use that. What a tree yields depends on ``p_k``, the chance that the ``k``-th candidate drawn at a node is the
one the verifier accepts (the *positional acceptance vector*): a node reached with children of ranks ``1..k`` passes
on to child ``i`` with probability ``p_i``, so the expected tokens of one verification are the sum, over the tree's
nodes, of the chance of reaching each (the root, the token already decided, counts for the verifier's own token).

* :func:`best_tree`: Sequoia's dynamic program, the tree of ``n`` nodes and depth at most ``d`` with the most expected
  tokens (optimal substructure: a subtree's best shape depends only on its size and depth).
* :class:`TreeShape`: the result, nodes in breadth-first order (what level 1 expands depth by depth).
* :class:`PositionalAcceptance`: ``p_k`` measured during the call, from each verified node's accepted rank.

Example:
    >>> shape = best_tree([0.6, 0.3], size=4, depth=2)
    >>> shape.parents, round(shape.expected_tokens, 3)  # two candidates at the root, the first with a child
    ([-1, 0, 0, 1], 2.26)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_BRANCH = 8
"""The most candidates a node may have (ranks beyond it are rarely accepted, and the program's cost grows with it)."""


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
    tokens per verification, for the positional acceptance vector ``acceptance`` (``p_1, p_2, ...``: the chance that
    a node's ``k``-th candidate is accepted; at most :data:`MAX_BRANCH` are used).

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
    """:func:`best_tree` for each of ``sizes`` from one run of the program (it solves every smaller size on the way);
    the vector is rounded to 3 decimals, so the rounds of a call that measured about the same reuse one run.

    Example:
        >>> [t.size for t in best_trees([0.6, 0.3], [2, 4], depth=2)]
        [2, 4]
    """
    p = tuple(round(float(a), 3) for a in acceptance[:MAX_BRANCH])
    if min(sizes) < 1 or depth < 0:
        raise ValueError(f"best_tree needs sizes >= 1 and depth >= 0, got sizes={sizes}, depth={depth}.")
    splits, best = _program(p, max(sizes), depth)
    return [TreeShape(_breadth_first(splits, size, depth), best[(size, depth)]) for size in sizes]


@functools.lru_cache(maxsize=64)
def _program(p: tuple[float, ...], size: int, depth: int):
    """Sequoia's program for vector ``p`` up to ``size`` nodes and ``depth``: each ``(n, d)``'s best children sizes
    (``splits[(n, d)]``: one subtree size per rank, in rank order) and best value (``best[(n, d)]``)."""
    best = {(n, 0): 1.0 for n in range(1, size + 1)}
    splits: dict[tuple[int, int], tuple[int, ...]] = {(n, 0): () for n in range(1, size + 1)}
    for d in range(1, depth + 1):
        table, choice = _split_table(p, size - 1, [0.0] + [best[(j, d - 1)] for j in range(1, size)])
        for n in range(1, size + 1):
            best[(n, d)], splits[(n, d)] = 1.0 + table[0][n - 1], _parts(choice, n - 1)
    return splits, best


def _split_table(p: tuple[float, ...], m: int, subtree: list[float]):
    """``table[k][r]``: the most expected tokens of at most ``r`` nodes spread over the subtrees of the candidates of
    ranks ``k, k + 1, ...`` (contiguous: a rank with no subtree ends them), ``subtree[j]`` the best of ``j`` nodes;
    ``choice[k][r]`` the size rank ``k`` gets (0: none)."""
    ranks = len(p)
    table = [[0.0] * (m + 1) for _ in range(ranks + 1)]
    choice = [[0] * (m + 1) for _ in range(ranks + 1)]
    for k in range(ranks - 1, -1, -1):
        for r in range(1, m + 1):
            for j in range(1, r + 1):
                value = p[k] * subtree[j] + table[k + 1][r - j]
                if value > table[k][r] + 1e-12:
                    table[k][r], choice[k][r] = value, j
    return table, choice


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

    Each verified node with ``c`` candidates counts as a trial for ranks ``1..c`` and a success for the rank accepted
    (which candidates are judged depends only on the earlier ones, so ``p_k`` does not depend on how many follow). A
    chain's verdict is the same with one candidate per node. Until a rank has been tried it keeps its prior: rank 1
    the level's per-token acceptance, each later rank a share of what the ranks before it left.

    Args:
        prior_first: the prior ``p_1``.
        weight: how many trials each prior counts for.

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

    def observe_chain(self, drafted: int, accepted: int) -> None:
        """A chain's verdict: ``accepted`` leading drafts of ``drafted`` (one candidate per node)."""
        for _ in range(accepted):
            self.observe(1, 0)
        if accepted < drafted:
            self.observe(1, -1)

    def to_dict(self) -> dict[str, list[float]]:
        """The raw counts per rank (``trials``, ``accepted``): what a call measured, without the priors."""
        return {"trials": list(self.trials), "accepted": list(self.successes)}

    def vector(self, ranks: int) -> list[float]:
        """``[p_1 .. p_ranks]``, the measured rates shrunk toward the priors (their sum is at most 1)."""
        out: list[float] = []
        for k in range(ranks):
            prior = self.prior_first if k == 0 else self.PRIOR_SHARE * max(0.0, 1.0 - sum(out))
            trials = self.trials[k] if k < len(self.trials) else 0.0
            successes = self.successes[k] if k < len(self.successes) else 0.0
            estimate = (successes + self.weight * prior) / (trials + self.weight)
            out.append(min(estimate, max(0.0, 1.0 - sum(out))))
        return out
