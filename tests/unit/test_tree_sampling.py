"""Token trees: the multi-candidate rule is exact, tree verification walks it, Sequoia's program is optimal.

The exact test computes the output distribution of :func:`~hf_triforce.sampling.verify_candidates` analytically from
the very functions it uses (``acceptance_probability`` and ``after_rejection``), over every order in which ``k``
candidates can be drawn without replacement from ``q``, and compares it with ``p`` to 1e-9 in float64; the empirical
test runs the rule itself with its RNG. The shape tests compare the dynamic program with a brute force over every
tree of a few nodes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from hf_triforce.hierarchy import tree_shape
from hf_triforce.hierarchy.tree_shape import PositionalAcceptance, TreeShape, best_tree, best_trees, chain
from hf_triforce.sampling import acceptance_probability, after_rejection, verify_candidates, verify_tree

pytestmark = pytest.mark.unit

ATOL = 1e-9
ALPHA = 1e-3


def _dist(n: int) -> st.SearchStrategy[torch.Tensor]:
    weight = st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.sampled_from([1e-30, 1e-12, 1.0]))
    lists = st.lists(weight, min_size=n, max_size=n).filter(lambda w: sum(w) > 0)
    return lists.map(lambda w: torch.tensor(w, dtype=torch.float64) / sum(w))


def candidates_output(p: torch.Tensor, q: torch.Tensor | None, k: int) -> torch.Tensor:
    """Exact distribution of :func:`verify_candidates`'s token for ``k`` candidates drawn without replacement from
    ``q``: ``out(p, q, k) = sum_c q(c) [a(c) 1{c} + (1 - a(c)) out(p', q', k - 1)]``, ``out(p, q, 0) = p``."""
    if k == 0 or q is None:
        return p
    out = torch.zeros_like(p)
    for c in range(p.shape[0]):
        if q[c] <= 0:
            continue
        a = acceptance_probability(p[None], q[None], torch.tensor([c]))[0]
        rest_p, rest_q = after_rejection(p, q, c)
        out[c] += q[c] * a
        out += q[c] * (1.0 - a) * candidates_output(rest_p, rest_q, k - 1)
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(_dist(n), _dist(n), st.integers(1, 4))))
def test_multi_candidate_rule_outputs_exactly_p(args):
    p, q, k = args
    torch.testing.assert_close(candidates_output(p, q, k), p, atol=ATOL, rtol=0.0)


def test_exact_harness_detects_a_wrong_rule():
    """Judging every candidate against the original p (no residual after a rejection) is not exact: the harness must
    see it."""
    p, q = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64), torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)

    def wrong(p, q, k):
        if k == 0 or q is None:
            return p
        out = torch.zeros_like(p)
        for c in range(3):
            if q[c] <= 0:
                continue
            a = acceptance_probability(p[None], q[None], torch.tensor([c]))[0]
            _, rest_q = after_rejection(p, q, c)
            out[c] += q[c] * a
            out += q[c] * (1 - a) * wrong(p, rest_q, k - 1)  # p stays p
        return out

    assert not torch.allclose(wrong(p, q, 2), p, atol=1e-3)
    torch.testing.assert_close(candidates_output(p, q, 2), p, atol=ATOL, rtol=0.0)


def test_multi_candidate_rule_chisquare():
    """20000 runs of verify_candidates with 3 candidates drawn without replacement by torch.multinomial (as level 1
    draws them): the token is distributed as p (chi-square at 0.001, fixed seed)."""
    p = torch.tensor([0.05, 0.4, 0.05, 0.3, 0.2])
    q = torch.tensor([0.5, 0.1, 0.2, 0.1, 0.1])
    gen = torch.Generator().manual_seed(7)
    counts = np.zeros(5)
    for _ in range(20_000):
        drawn = torch.multinomial(q, 3, replacement=False, generator=gen).tolist()
        _, token = verify_candidates(p, q, drawn, gen)
        counts[token] += 1
    expected = p.double().numpy()
    expected *= counts.sum() / expected.sum()
    assert chisquare(counts, expected).pvalue > ALPHA, counts


def test_tree_sampling_two_levels_chisquare():
    """A depth-2 tree (two candidates at the root, two under each): the first two tokens follow p0 x p1 jointly."""
    v = 3
    p0, q0 = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.2, 0.6])
    p1 = {0: torch.tensor([0.1, 0.1, 0.8]), 1: torch.tensor([0.6, 0.2, 0.2]), 2: torch.tensor([0.3, 0.3, 0.4])}
    q1 = torch.tensor([0.4, 0.4, 0.2])
    gen = torch.Generator().manual_seed(3)
    counts = np.zeros((v, v))
    children = [[1, 2], [3, 4], [5, 6], [], [], [], []]
    for _ in range(20_000):
        first = torch.multinomial(q0, 2, generator=gen).tolist()
        nodes, target_rows, draft_rows = [9, *first], [p0, p1[first[0]], p1[first[1]]], [q0, q1, q1]
        for _ in first:
            nodes += torch.multinomial(q1, 2, generator=gen).tolist()
            target_rows += [torch.full((v,), 1.0 / v)] * 2  # leaves' next distributions: not part of this check
            draft_rows += [q1, q1]
        target, draft = torch.stack(target_rows), torch.stack(draft_rows)
        path, token, _ = verify_tree(torch.tensor(nodes), children, target, draft, gen)
        emitted = [nodes[n] for n in path] + [token]
        if len(emitted) == 1:  # the second token comes from the next round: a plain draw from p1 of the first
            emitted.append(int(torch.multinomial(p1[emitted[0]], 1, generator=gen)))
        counts[emitted[0], emitted[1]] += 1
    expected = torch.stack([p0[a] * p1[a] for a in range(v)]).double().numpy()
    expected *= counts.sum() / expected.sum()
    assert chisquare(counts.ravel(), expected.ravel()).pvalue > ALPHA, counts


def test_greedy_tree_takes_the_matching_candidate_and_stops_at_a_mismatch():
    tokens = torch.tensor([0, 3, 1, 2, 4])
    children = [[1, 2], [], [3, 4], [], []]
    scores = torch.zeros(5, 6)
    scores[0, 1] = scores[2, 4] = scores[4, 5] = 1.0  # root -> 1 (node 2), then 4 (node 4), then 5
    assert verify_tree(tokens, children, scores) == ([2, 4], 5, [1, 1])
    scores[0] = 0.0
    scores[0, 5] = 1.0  # no candidate matches at the root
    assert verify_tree(tokens, children, scores) == ([], 5, [-1])


def _brute_force(p: list[float], size: int, depth: int) -> float:
    """The best expected tokens over every tree of at most ``size`` nodes and depth ``depth`` (children in rank order,
    so a node's shape is a tuple of subtree shapes)."""

    def trees(n, d):
        yield ()
        if d == 0 or n == 0:
            return
        for first in range(1, n + 1):
            for sub in trees(first - 1, d - 1):
                for rest in trees(n - first, d):
                    if len(rest) < len(p):
                        yield (sub, *rest)

    def value(tree):
        return 1.0 + sum(p[k] * value(child) for k, child in enumerate(tree))

    return max(value(t) for t in trees(size - 1, depth))


@pytest.mark.parametrize("p", [[0.9], [0.6, 0.3], [0.5, 0.2, 0.1], [0.3, 0.3, 0.3]])
@pytest.mark.parametrize("size,depth", [(1, 3), (3, 1), (5, 2), (6, 4), (7, 3)])
def test_sequoia_program_is_optimal(p, size, depth):
    shape = best_tree(p, size, depth)
    assert shape.size <= size and shape.depth <= depth
    assert shape.expected_tokens == pytest.approx(_brute_force(p, size, depth))
    assert _reached(shape, p) == pytest.approx(shape.expected_tokens)


def _reached(shape: TreeShape, p: list[float]) -> float:
    """The shape's own expected tokens, recomputed from its parents: the sum of each node's chance of being reached."""
    reach = [1.0] * shape.size
    for i in range(1, shape.size):
        reach[i] = reach[shape.parents[i]] * p[shape.children[shape.parents[i]].index(i)]
    return sum(reach)


@pytest.mark.parametrize("p", [[0.9], [0.6, 0.3], [0.5, 0.2, 0.1]])
def test_one_program_run_gives_every_size(p):
    shapes = best_trees(p, [1, 3, 5, 7], depth=3)
    for shape, size in zip(shapes, [1, 3, 5, 7], strict=True):
        assert shape.size <= size and shape.depth <= 3
        assert shape.expected_tokens == pytest.approx(_brute_force(p, size, 3))
        assert _reached(shape, p) == pytest.approx(shape.expected_tokens)


def _split_table_loops(p: tuple[float, ...], m: int, subtree: list[float]):
    """The reference of ``tree_shape._split_table``: the split program as plain loops (``choice``: the first ``j``
    that improves on the best so far by more than ``1e-12``)."""
    table = [[0.0] * (m + 1) for _ in range(len(p) + 1)]
    choice = [[0] * (m + 1) for _ in range(len(p) + 1)]
    for k in range(len(p) - 1, -1, -1):
        for r in range(1, m + 1):
            for j in range(1, r + 1):
                value = p[k] * subtree[j] + table[k + 1][r - j]
                if value > table[k][r] + 1e-12:
                    table[k][r], choice[k][r] = value, j
    return table, choice


@pytest.mark.parametrize("seed", range(40))
def test_split_table_matches_the_loops(seed):
    """The vectorized split program gives the loops' values and choices: vectors as the planner rounds them (2
    decimals, ties among ranks), zeros, and the flat subtree values of depth 0 (every size ties)."""
    rng = np.random.default_rng(seed)
    ranks, m = int(rng.integers(1, tree_shape.MAX_BRANCH + 1)), int(rng.integers(0, 64))
    p = tuple(float(x) for x in np.round(np.sort(rng.uniform(0, 1, ranks))[::-1] * rng.uniform(0.2, 1), 2))
    if seed % 5 == 0:
        p = (*p[:-1], 0.0)
    depth0 = seed % 4 == 0
    subtree = [0.0] + ([1.0] * m if depth0 else np.cumsum(rng.uniform(0.01, 1, m)).round(3).tolist())
    table, choice = tree_shape._split_table(p, m, subtree)
    want_table, want_choice = _split_table_loops(p, m, subtree)
    assert choice == want_choice
    assert np.allclose(table, want_table, rtol=0, atol=1e-12)


def test_breadth_first_order_and_chain():
    shape = best_tree([0.6, 0.3], size=7, depth=3)
    assert shape.depths == sorted(shape.depths)
    assert all(shape.parents[i] < i for i in range(1, shape.size))
    assert best_tree([0.9], 5, 10).is_chain() and chain(4, [0.9]).parents == best_tree([0.9], 5, 10).parents
    assert chain(4, [0.9]).expected_tokens == pytest.approx(best_tree([0.9], 5, 10).expected_tokens)
    assert isinstance(best_tree([0.5], 1, 0), TreeShape) and best_tree([0.5], 1, 0).parents == [-1]


def test_positional_acceptance_learns_the_ranks():
    acc = PositionalAcceptance(prior_first=0.5, weight=1.0)
    for _ in range(200):
        acc.observe(3, 1)
    p = acc.vector(3)
    assert p[1] > 0.9 and p[0] < 0.05 and sum(p) <= 1.0 + 1e-12
    acc.observe_chain(drafted=4, accepted=2)
    assert acc.trials[0] == 203 and acc.successes[0] == 2


def test_all_orders_are_enumerated():
    """The analytic harness sums over every ordered draw of k distinct candidates (|V|!/(|V|-k)! of them)."""
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    orders = list(itertools.permutations(range(3), 2))
    mass = sum(float(q[a] * q[b] / (1 - q[a])) for a, b in orders)
    assert mass == pytest.approx(1.0)
