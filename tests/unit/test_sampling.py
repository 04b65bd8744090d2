"""Verification rules of hf_triforce.sampling: exact losslessness, composition, empirical checks, edge cases.

The exact tests compute the output distribution of a verification step analytically from the very functions
``verify_sampled`` uses (``acceptance_probability`` and ``residual_distribution``) and compare it with the
verifier's distribution to 1e-9 in float64. The empirical tests run ``verify_sampled`` itself with its RNG.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from hf_triforce import sampling
from hf_triforce.sampling import acceptance_probability, residual_distribution, verify_greedy, verify_sampled

pytestmark = pytest.mark.unit

ATOL = 1e-9
ALPHA = 1e-3  # significance level of every chi-square test in this file
N_EMPIRICAL = 20_000

# --------------------------------------------------------------------------------------------------------------
# exact output distribution of one verification step
# --------------------------------------------------------------------------------------------------------------


def _one_hot(x: int, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.float64)
    out[x] = 1.0
    return out


def step_output(p: torch.Tensor, q: torch.Tensor | None, drafted: int | None = None) -> torch.Tensor:
    """Exact distribution of the token emitted for one drafted position.

    ``out(y) = sum_x q(x) [a(x) 1{y = x} + (1 - a(x)) r_x(y)]`` with ``a`` and ``r_x`` from the package. With
    ``q=None`` the draft is deterministic (one-hot at ``drafted``) and the sum has the single term ``x = drafted``.
    """
    n = p.shape[0]
    terms = [(drafted, 1.0)] if q is None else [(x, float(q[x])) for x in range(n)]
    out = torch.zeros(n, dtype=torch.float64)
    for x, weight in terms:
        a = acceptance_probability(p[None], None if q is None else q[None], torch.tensor([x]))[0]
        r = residual_distribution(p, q, x)
        out += weight * (a * _one_hot(x, n) + (1.0 - a) * r)
    return out


def assert_dist_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0.0)


# --------------------------------------------------------------------------------------------------------------
# strategies: probability vectors over 2..8 tokens, float64, with zeros and near-degenerate values
# --------------------------------------------------------------------------------------------------------------

_DEGENERATE = [1e-300, 1e-200, 1e-30, 1e-16, 1e-12, 1.0 - 1e-12, 1.0]
_weight = st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.sampled_from(_DEGENERATE))


def _normalize(weights) -> torch.Tensor:
    t = torch.as_tensor(weights, dtype=torch.float64)
    return t / t.sum()


def prob_vectors(n: int) -> st.SearchStrategy[torch.Tensor]:
    return st.lists(_weight, min_size=n, max_size=n).filter(lambda w: sum(w) > 0).map(_normalize)


@st.composite
def p_q_pairs(draw) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) of the same size; q related to p in the ways that stress the rule."""
    n = draw(st.integers(2, 8))
    p = draw(prob_vectors(n))
    kind = draw(st.sampled_from(["independent", "equal", "zeros_where_p_positive", "near_equal", "one_hot", "p_zero"]))
    if kind == "independent":
        q = draw(prob_vectors(n))
    elif kind == "equal":
        q = p.clone()
    elif kind == "zeros_where_p_positive":
        support = [i for i in range(n) if p[i] > 0]
        zeroed = draw(st.lists(st.sampled_from(support), min_size=1, unique=True))
        w = draw(prob_vectors(n)).clone()
        w[zeroed] = 0.0
        if w.sum() == 0:
            keep = draw(st.sampled_from([i for i in range(n) if i not in zeroed] or [0]))
            w = _one_hot(keep, n)
        q = _normalize(w)
    elif kind == "near_equal":
        eps = draw(st.sampled_from([1e-15, 1e-12, 1e-8, 1e-4]))
        noise = torch.tensor(draw(st.lists(st.floats(-1.0, 1.0), min_size=n, max_size=n)), dtype=torch.float64)
        q = _normalize(p * (1.0 + eps * noise))
    elif kind == "one_hot":
        q = _one_hot(draw(st.integers(0, n - 1)), n)
    else:  # q concentrated where p is zero (if any): every draft there must be rejected
        w = draw(prob_vectors(n)).clone()
        zeros = p == 0
        q = _normalize(w * zeros) if bool((w * zeros).sum() > 0) else w
    if draw(st.booleans()):
        p, q = q, p  # symmetric cases: p with zeros where q is positive, p one-hot, ...
    return p, q


# --------------------------------------------------------------------------------------------------------------
# 1. one draft step is exact
# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(p_q_pairs())
def test_one_step_output_distribution_is_exactly_p(pq):
    p, q = pq
    out = step_output(p, q)
    assert_dist_equal(out, p)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8).flatmap(lambda n: st.tuples(prob_vectors(n), st.integers(0, n - 1))))
def test_one_step_deterministic_draft_is_exactly_p(args):
    """draft_probs=None: for ANY drafted token x0 (conditionally on it), the output is exactly p."""
    p, x0 = args
    out = step_output(p, None, x0)
    assert_dist_equal(out, p)
    # the explicit one-hot q gives the same distribution as draft_probs=None
    assert_dist_equal(step_output(p, _one_hot(x0, p.shape[0])), out)


def test_exact_harness_detects_reference_implementation_bug():
    """Power check: resampling from p instead of the residual (the reference implementation's level-1 bug)
    is not lossless, and step_output sees it."""
    p = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    q = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    n = p.shape[0]
    buggy = torch.zeros(n, dtype=torch.float64)
    for x in range(n):
        a = acceptance_probability(p[None], q[None], torch.tensor([x]))[0]
        buggy += q[x] * (a * _one_hot(x, n) + (1 - a) * p)
    assert (buggy - p).abs().max() > 0.1
    assert_dist_equal(step_output(p, q), p)


# --------------------------------------------------------------------------------------------------------------
# 2. composition: level 0 -> level 1 -> level 2, and multi-token drafts
# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 8).flatmap(
        lambda n: st.tuples(prob_vectors(n), prob_vectors(n), prob_vectors(n), st.integers(0, n - 1), st.booleans())
    )
)
def test_two_level_hierarchy_is_exact(args):
    """Level 0 (q0) verified by level 1 (p1), whose tokens are verified by level 2 (p2) with p1 as the draft
    distribution, as TriForce does (level 2 checks level 1 against p_hat = p1)."""
    q0, p1, p2, x0, deterministic = args
    n = p1.shape[0]
    if deterministic:
        q0 = None
    # level 1 output distribution
    out1 = step_output(p1, q0, x0)
    assert_dist_equal(out1, p1)
    # level 2 fed with level 1's exact output distribution
    assert_dist_equal(step_output(p2, out1), p2)
    # full nested enumeration: x0 -> x1 (level 1 transition) -> y (level 2 transition with q = p1)
    level0 = [(x0, 1.0)] if q0 is None else [(x, float(q0[x])) for x in range(n)]
    final = torch.zeros(n, dtype=torch.float64)
    marginal1 = torch.zeros(n, dtype=torch.float64)
    for x, w0 in level0:
        a1 = acceptance_probability(p1[None], None if q0 is None else q0[None], torch.tensor([x]))[0]
        t1 = a1 * _one_hot(x, n) + (1 - a1) * residual_distribution(p1, q0, x)
        for x1 in range(n):
            w1 = w0 * float(t1[x1])
            marginal1[x1] += w1
            a2 = acceptance_probability(p2[None], p1[None], torch.tensor([x1]))[0]
            final += w1 * (a2 * _one_hot(x1, n) + (1 - a2) * residual_distribution(p2, p1, x1))
    assert_dist_equal(marginal1, p1)
    assert_dist_equal(final, p2)


class _ConditionalTable:
    """Next-token distributions that depend on the whole prefix, generated deterministically from a seed."""

    def __init__(self, seed: int, vocab: int, zero_prob: float, copy_of: _ConditionalTable | None = None):
        self.rng = np.random.default_rng(seed)
        self.vocab, self.zero_prob, self.copy_of = vocab, zero_prob, copy_of
        self.table: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.table:
            kind = self.rng.integers(4)
            if kind == 1 and self.copy_of is not None:  # same distribution as the other table here (draft == target)
                self.table[prefix] = self.copy_of(prefix).clone()
            else:
                w = self.rng.dirichlet(np.full(self.vocab, 0.7))
                w[self.rng.random(self.vocab) < self.zero_prob] = 0.0
                if kind == 2 and w.sum() > 0:  # near-degenerate: one token carries almost all the mass
                    w[int(np.argmax(w))] = 1.0 / 1e-12
                if w.sum() == 0:
                    w[self.rng.integers(self.vocab)] = 1.0
                self.table[prefix] = _normalize(w)
        return self.table[prefix]


def _iteration_outcomes(prefix, k, p, q, deterministic):
    """Exact distribution of the tokens emitted by one draft-and-verify iteration (the verify_sampled procedure:
    k drafts, accept/reject chain, residual at the first rejection, bonus token when all k are accepted)."""
    vocab = p(()).shape[0]
    outcomes: dict[tuple[int, ...], float] = defaultdict(float)
    if deterministic:  # greedy tiny drafter: one draft sequence, weight 1, draft_probs=None
        drafts, ctx = [], prefix
        for _ in range(k):
            drafts.append(int(torch.argmax(q(ctx))))
            ctx += (drafts[-1],)
        draft_seqs = [(tuple(drafts), 1.0)]
    else:
        draft_seqs = []
        for drafts in itertools.product(range(vocab), repeat=k):
            w = 1.0
            for i, x in enumerate(drafts):
                w *= float(q(prefix + drafts[:i])[x])
            draft_seqs.append((drafts, w))
    for drafts, w in draft_seqs:
        if w == 0.0:
            continue
        target = torch.stack([p(prefix + drafts[:i]) for i in range(k + 1)])
        draft = None if deterministic else torch.stack([q(prefix + drafts[:i]) for i in range(k)])
        accept = acceptance_probability(target[:k], draft, torch.tensor(drafts))
        all_accepted = w
        for i in range(k):
            residual = residual_distribution(target[i], None if draft is None else draft[i], drafts[i])
            for y in range(vocab):
                outcomes[drafts[:i] + (y,)] += all_accepted * float(1.0 - accept[i]) * float(residual[y])
            all_accepted *= float(accept[i])
        for y in range(vocab):
            outcomes[drafts + (y,)] += all_accepted * float(target[k][y])
    return outcomes


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 4),
    k=st.integers(1, 3),
    zero_prob=st.sampled_from([0.0, 0.3, 0.6]),
    deterministic=st.booleans(),
)
def test_multi_token_generation_is_exact(seed, vocab, k, zero_prob, deterministic):
    """Draft k tokens with prefix-dependent q, verify with prefix-dependent p, repeat until L tokens are out;
    enumerate every path analytically; the distribution of the first L output tokens (L = 1, 2, 3: first token,
    (first, second) pair, triple) equals the target's joint prod_t p(y_t | y_<t)."""
    p = _ConditionalTable(seed, vocab, zero_prob)
    q = _ConditionalTable(seed + 1, vocab, zero_prob, copy_of=p)

    @cache
    def generation(prefix: tuple[int, ...], length: int) -> dict[tuple[int, ...], float]:
        if length == 0:
            return {(): 1.0}
        dist: dict[tuple[int, ...], float] = defaultdict(float)
        for emitted, w in _iteration_outcomes(prefix, k, p, q, deterministic).items():
            head = emitted[:length]
            for tail, w_tail in generation(prefix + head, length - len(head)).items():
                dist[head + tail] += w * w_tail
        return dict(dist)

    for length in (1, 2, 3):
        dist = generation((), length)
        for seq in itertools.product(range(vocab), repeat=length):
            expected = 1.0
            for t in range(length):
                expected *= float(p(seq[:t])[seq[t]])
            assert abs(dist.get(seq, 0.0) - expected) <= ATOL, (length, seq, dist.get(seq, 0.0), expected)


# --------------------------------------------------------------------------------------------------------------
# 3. empirical checks of verify_sampled itself (real RNG)
# --------------------------------------------------------------------------------------------------------------

P_EMP = torch.tensor([0.05, 0.10, 0.15, 0.30, 0.40])
Q_EMP = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05])
P_NEXT = torch.tensor([0.25, 0.05, 0.30, 0.20, 0.20])  # bonus row (does not affect the first token)


def _first_tokens(p, q, *, deterministic: bool, seed: int, n: int = N_EMPIRICAL) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)  # vectorized draft sampling, x ~ q
    target = torch.stack([p, P_NEXT])
    draft_probs = None if deterministic else q[None]
    counts = np.zeros(p.shape[0], dtype=np.int64)
    for x in drafts:
        n_acc, nxt = verify_sampled(x[None], draft_probs, target, generator=g)
        counts[int(x) if n_acc == 1 else nxt] += 1
    return counts


def _chisquare_pvalue(counts: np.ndarray, p: torch.Tensor) -> float:
    support = p.numpy() > 0
    assert counts[~support].sum() == 0, f"tokens with p = 0 were emitted: {counts}"
    expected = p.numpy()[support].astype(np.float64) * counts.sum()
    expected *= counts[support].sum() / expected.sum()
    return float(chisquare(counts[support], expected).pvalue)


@pytest.mark.parametrize("deterministic", [False, True], ids=["draft_probs", "draft_probs_none"])
@pytest.mark.parametrize("p", [P_EMP, torch.tensor([0.0, 0.2, 0.3, 0.1, 0.4])], ids=["p_full", "p_with_zero"])
def test_verify_sampled_first_token_matches_p_chisquare(p, deterministic):
    """20000 runs of verify_sampled with x ~ q; the first output token is distributed as p.

    Chi-square goodness-of-fit test at significance level 0.001 (fixed seed, so the test is deterministic).
    With draft_probs=None the same draws x are passed as deterministic (one-hot) drafts: the output is exact
    conditionally on each x, hence for any source of x.
    """
    counts = _first_tokens(p, Q_EMP, deterministic=deterministic, seed=1234)
    assert _chisquare_pvalue(counts, p) > ALPHA, counts


def test_verify_sampled_pair_matches_joint_chisquare():
    """k=2 drafts with position-dependent p_i, q_i; the (first, second) output pair follows p0 x p1.

    When only one token comes out, the second comes from the next verify_sampled call (drafting from q1 and
    verifying against p1), as in the real decoding loop. Chi-square test at significance level 0.001.
    """
    p0, p1, p2 = P_EMP, P_NEXT, torch.tensor([0.2] * 5)
    q0, q1 = Q_EMP, torch.tensor([0.1, 0.5, 0.1, 0.1, 0.2])
    g = torch.Generator().manual_seed(99)
    x0 = torch.multinomial(q0, N_EMPIRICAL, replacement=True, generator=g)
    x1 = torch.multinomial(q1, N_EMPIRICAL, replacement=True, generator=g)
    x1_next = torch.multinomial(q1, N_EMPIRICAL, replacement=True, generator=g)
    target, draft = torch.stack([p0, p1, p2]), torch.stack([q0, q1])
    counts = np.zeros((5, 5), dtype=np.int64)
    for i in range(N_EMPIRICAL):
        drafts = torch.stack([x0[i], x1[i]])
        n_acc, nxt = verify_sampled(drafts, draft, target, generator=g)
        emitted = drafts[:n_acc].tolist() + [nxt]
        if len(emitted) == 1:
            n_acc2, nxt2 = verify_sampled(x1_next[i : i + 1], q1[None], torch.stack([p1, p2]), generator=g)
            emitted.append(int(x1_next[i]) if n_acc2 == 1 else nxt2)
        counts[emitted[0], emitted[1]] += 1
    joint = torch.outer(p0, p1).flatten()
    assert _chisquare_pvalue(counts.flatten(), joint) > ALPHA


def test_empirical_check_detects_reference_implementation_bug(monkeypatch):
    """Power check: with the residual replaced by p (the reference implementation's level-1 bug), the same
    chi-square test at significance level 0.001 rejects."""
    monkeypatch.setattr(sampling, "residual_distribution", lambda target, draft, token=None: target)
    counts = _first_tokens(P_EMP, Q_EMP, deterministic=False, seed=1234, n=5000)
    assert _chisquare_pvalue(counts, P_EMP) < ALPHA


# --------------------------------------------------------------------------------------------------------------
# 4. verify_greedy
# --------------------------------------------------------------------------------------------------------------


def _scores(*argmaxes: int, vocab: int = 4) -> torch.Tensor:
    s = torch.zeros(len(argmaxes), vocab)
    for i, a in enumerate(argmaxes):
        s[i, a] = 1.0
    return s


def test_verify_greedy_all_accepted_returns_bonus_argmax():
    assert verify_greedy(torch.tensor([2, 0, 3]), _scores(2, 0, 3, 1)) == (3, 1)


def test_verify_greedy_first_mismatch():
    assert verify_greedy(torch.tensor([2, 1, 3]), _scores(2, 0, 3, 1)) == (1, 0)  # later match ignored
    assert verify_greedy(torch.tensor([1, 0]), _scores(2, 0, 3)) == (0, 2)


def test_verify_greedy_empty_draft():
    scores = torch.tensor([[0.1, -2.0, 3.5, 0.0]])
    assert verify_greedy(torch.empty(0, dtype=torch.long), scores) == (0, 2)


def test_verify_greedy_ties_follow_torch_argmax():
    row = torch.tensor([1.0, 3.0, 3.0, float("-inf")])
    tie_winner = int(torch.argmax(row))
    assert tie_winner == 1  # torch.argmax: first maximal index
    scores = torch.stack([row, row])
    assert verify_greedy(torch.tensor([2]), scores) == (0, tie_winner)
    assert verify_greedy(torch.tensor([1]), scores) == (1, tie_winner)
    flat = torch.full((2, 4), float("-inf"))
    flat[:, 1:3] = 0.0
    assert verify_greedy(torch.tensor([1]), flat) == (1, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 5).flatmap(
        lambda k: st.tuples(
            st.lists(st.integers(0, 3), min_size=k, max_size=k),
            st.lists(st.lists(st.integers(0, 2), min_size=4, max_size=4), min_size=k + 1, max_size=k + 1),
        )
    )
)
def test_verify_greedy_matches_reference_loop(args):
    """Scores with many ties; the result equals a plain loop over torch.argmax."""
    drafts, rows = args
    scores = torch.tensor(rows, dtype=torch.float32)
    n = 0
    while n < len(drafts) and drafts[n] == int(torch.argmax(scores[n])):
        n += 1
    assert verify_greedy(torch.tensor(drafts, dtype=torch.long), scores) == (n, int(torch.argmax(scores[n])))


# --------------------------------------------------------------------------------------------------------------
# 5. edge cases
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_verify_sampled_empty_draft_draws_from_first_row(deterministic):
    vocab = 4
    empty_tokens = torch.empty(0, dtype=torch.long)
    empty_probs = None if deterministic else torch.empty(0, vocab)
    assert verify_sampled(empty_tokens, empty_probs, torch.tensor([[0.0, 0.0, 1.0, 0.0]])) == (0, 2)
    g = torch.Generator().manual_seed(7)
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3]])
    counts = np.zeros(vocab, dtype=np.int64)
    for _ in range(3000):
        n_acc, nxt = verify_sampled(empty_tokens, empty_probs, p, generator=g)
        assert n_acc == 0
        counts[nxt] += 1
    assert _chisquare_pvalue(counts, p[0]) > ALPHA  # significance level 0.001


def test_target_zero_always_rejects():
    p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    for q in (torch.tensor([[0.9, 0.05, 0.05]]), None):
        assert acceptance_probability(p[:1], q, torch.tensor([0])).item() == 0.0
        g = torch.Generator().manual_seed(0)
        for _ in range(300):
            n_acc, nxt = verify_sampled(torch.tensor([0]), q, p, generator=g)
            assert n_acc == 0 and nxt != 0


def test_draft_token_with_zero_draft_probability():
    """A drafted x with q(x) = 0 cannot come from q; it is verified as a one-hot draft at x (accept with
    probability p(x), residual p without x). That is exact conditionally on x, so it cannot bias the output,
    and a token with p(x) = 0 is never emitted (accepting it outright would)."""
    q = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    for p in (
        torch.tensor([0.3, 0.1, 0.2, 0.4], dtype=torch.float64),
        torch.tensor([0.0, 0.1, 0.2, 0.7], dtype=torch.float64),
        torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64),
    ):
        for x in (0, 3):
            a = acceptance_probability(p[None], q[None], torch.tensor([x]))
            assert a.item() == pytest.approx(float(p[x]), abs=0)
            torch.testing.assert_close(residual_distribution(p, q, x), residual_distribution(p, None, x))
            # conditional on this x the output is exactly p
            n = p.shape[0]
            out = a[0] * _one_hot(x, n) + (1 - a[0]) * residual_distribution(p, q, x)
            assert_dist_equal(out, p)
    p = torch.tensor([[0.0, 0.1, 0.2, 0.7], [0.25] * 4], dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    for _ in range(300):
        n_acc, nxt = verify_sampled(torch.tensor([0]), q[None].float(), p, generator=g)
        assert n_acc == 0 and nxt != 0


def test_residual_when_p_equals_q():
    p = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    r = residual_distribution(p, p.clone(), 2)
    assert torch.isfinite(r).all()
    assert_dist_equal(r, p)
    assert torch.equal(
        acceptance_probability(p.expand(4, 4), p.expand(4, 4), torch.arange(4))[[0, 2, 3]],
        torch.ones(3, dtype=torch.float64),
    )
    target = torch.stack([p, p, p]).float()
    g = torch.Generator().manual_seed(5)
    for _ in range(200):  # every draft accepted when p == q
        drafts = torch.multinomial(target[0], 2, replacement=True, generator=g)
        assert verify_sampled(drafts, target[:2], target, generator=g)[0] == 2


def test_residual_values():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert_dist_equal(
        residual_distribution(p, torch.tensor([0.25, 0.75], dtype=torch.float64)),
        torch.tensor([1.0, 0.0], dtype=torch.float64),
    )
    # one-hot draft: p without the rejected token, renormalized
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert_dist_equal(residual_distribution(p, None, 2), torch.tensor([0.4, 0.6, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError):
        residual_distribution(p, None)


def test_acceptance_values():
    p = torch.tensor([[0.5, 0.5]])
    q = torch.tensor([[0.25, 0.75]])
    torch.testing.assert_close(acceptance_probability(p, q, torch.tensor([1])), torch.tensor([2.0 / 3.0]))
    torch.testing.assert_close(acceptance_probability(p, q, torch.tensor([0])), torch.tensor([1.0]))
    torch.testing.assert_close(acceptance_probability(p, None, torch.tensor([0])), torch.tensor([0.5]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_probabilities_are_verified_in_float32(dtype):
    """Half inputs must behave exactly like their float32 values (same seed -> same result).

    A half-precision uniform draw is the float32 draw rounded to nearest (bfloat16: 256 levels in [0.5, 1)), so
    comparing it with the acceptance ratio biases P(accept) by up to half an ulp (~2e-3 in bfloat16), and a
    half-precision p/q is itself rounded. 32 drafts per call with acceptance ~0.99 make a flip near-certain to
    show up somewhere in 1000 seeds if the verification is done in half precision.
    """
    k = 32
    target = torch.tensor([[0.69, 0.31]] * k + [[0.5, 0.5]]).to(dtype)
    draft = torch.tensor([[0.7, 0.3]] * k).to(dtype)
    drafts = torch.zeros(k, dtype=torch.long)
    for seed in range(1000):
        half = verify_sampled(drafts, draft, target, generator=torch.Generator().manual_seed(seed))
        full = verify_sampled(drafts, draft.float(), target.float(), generator=torch.Generator().manual_seed(seed))
        assert half == full, seed


@pytest.mark.parametrize("deterministic", [False, True], ids=["draft_probs", "draft_probs_none"])
def test_verify_sampled_bonus_token_comes_from_row_k(deterministic):
    """All k drafts accepted -> the next token is drawn from target_probs[k], not from any earlier row."""
    one_hot_rows = torch.eye(4)[[1, 2, 3]]  # rows 0, 1 put all mass on the drafts 1, 2; row 2 (bonus) on 3
    draft = None if deterministic else one_hot_rows[:2]
    assert verify_sampled(torch.tensor([1, 2]), draft, one_hot_rows) == (2, 3)
    # bonus distribution: chi-square test at significance level 0.001
    p = torch.tensor([0.9, 0.1, 0.0, 0.0, 0.0])  # q == p: always accepted; draft_probs=None: accepted w.p. p(x)
    target = torch.stack([p, p, P_NEXT])
    g = torch.Generator().manual_seed(11)
    counts = np.zeros(5, dtype=np.int64)
    for _ in range(5000):
        drafts = torch.multinomial(p, 2, replacement=True, generator=g)
        n_acc, nxt = verify_sampled(drafts, None if deterministic else target[:2], target, generator=g)
        if n_acc == 2:
            counts[nxt] += 1
    assert counts.sum() > 2000
    assert _chisquare_pvalue(counts, P_NEXT) > ALPHA
