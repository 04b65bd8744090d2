"""The faster stand-ins for transformers' processors (hf_triforce.hf.fast_processors) against the installed
transformers classes themselves, bit for bit: top-p sorting only the finite scores, and the minimum lengths applied
to many positions at once. Where the stand-in must not sort itself (ties among finite scores, NaN, +inf, a finite
filter value, too many finite scores), transformers' own warper must run, and the result still be equal."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hf_triforce.hf import fast_processors
from hf_triforce.hf.fast_processors import (
    FINITE_LIMIT,
    FiniteTopP,
    fast_paths_checked,
    faster,
    finite_top_p,
    length_only,
    suppress_eos,
)

pytestmark = pytest.mark.unit


class CountingTopP(TopPLogitsWarper):
    """transformers' warper, counting how often the stand-in hands a call to it."""

    calls = 0

    def __call__(self, input_ids, scores):
        CountingTopP.calls += 1
        return super().__call__(input_ids, scores)


def _after_top_k(rows: int, vocab: int, top_k: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """``[rows, vocab]`` logits through temperature 0.6 and top-k, as ``generate()`` hands them to top-p; row ``i``
    keeps ``top_k - i`` tokens (at least one), so rows have different numbers of finite scores."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    out = torch.cat([TopKLogitsWarper(max(1, top_k - i))(None, logits[i : i + 1]) for i in range(rows)])
    return TemperatureLogitsWarper(0.6)(None, out)


def _assert_bit_equal(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(0.0), expected.nan_to_num(0.0))


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("min_keep", [1, 3, 80])
@pytest.mark.parametrize("top_k", [1, 7, 50, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_top_p_equals_transformers_bit_for_bit(top_p, min_keep, top_k, dtype):
    CountingTopP.calls = 0
    warper, tied = CountingTopP(top_p, min_tokens_to_keep=min_keep), 0
    for seed in range(3):
        scores = _after_top_k(5, 4096, top_k, seed, dtype)
        tied += bool(_has_finite_ties(scores))  # likely in half precision: those go to transformers' sort
        expected = TopPLogitsWarper(top_p, min_tokens_to_keep=min_keep)(None, scores)
        _assert_bit_equal(finite_top_p(warper, scores.clone()), expected)
    assert CountingTopP.calls == tied  # every other call the stand-in sorted itself
    assert tied == 0 or dtype != torch.float32


def _has_finite_ties(scores: torch.Tensor) -> bool:
    ordered = scores.sort(-1).values
    return bool(((ordered[:, 1:] == ordered[:, :-1]) & ordered[:, 1:].isfinite()).any())


@settings(max_examples=60, deadline=None)
@given(
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(1, 120),
    rows=st.integers(1, 8),
    scale=st.sampled_from([0.01, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_finite_top_p_equals_transformers_on_drawn_scores(top_p, top_k, rows, scale, seed):
    g = torch.Generator().manual_seed(seed)
    scores = TopKLogitsWarper(top_k)(None, torch.randn(rows, 2048, generator=g) * scale)
    _assert_bit_equal(finite_top_p(TopPLogitsWarper(top_p), scores.clone()), TopPLogitsWarper(top_p)(None, scores))


def _tied() -> torch.Tensor:
    scores = torch.full((2, 512), -math.inf)
    scores[:, [3, 40, 41, 99]] = torch.tensor([2.0, 1.0, 1.0, 0.5])  # 40 and 41 tie, near the 0.9 boundary
    return scores


def _nan() -> torch.Tensor:
    scores = _after_top_k(2, 512, 20, 0)
    scores[1, 7] = math.nan
    return scores


def _pos_inf() -> torch.Tensor:
    scores = _after_top_k(2, 512, 20, 1)
    scores[0, 9] = math.inf
    return scores


@pytest.mark.parametrize(
    "make_scores, filter_value",
    [
        (_tied, -math.inf),
        (_nan, -math.inf),
        (_pos_inf, -math.inf),
        (lambda: _after_top_k(3, 512, 20, 2), -1e4),
        (lambda: torch.randn(2, FINITE_LIMIT + 1), -math.inf),  # no top-k: every score finite
        (lambda: torch.full((2, 64), -math.inf), -math.inf),  # nothing finite
    ],
    ids=["tie", "nan", "pos-inf", "finite-filter", "too-many-finite", "all-inf"],
)
def test_finite_top_p_hands_what_it_cannot_sort_to_transformers(make_scores, filter_value):
    CountingTopP.calls = 0
    scores = make_scores()
    got = finite_top_p(CountingTopP(0.9, filter_value=filter_value), scores.clone())
    _assert_bit_equal(got, TopPLogitsWarper(0.9, filter_value=filter_value)(None, scores))
    assert CountingTopP.calls == 1


def test_finite_top_p_keeps_the_same_set_where_the_boundary_is_close():
    """A row whose cumulative sum crosses ``1 - top_p`` within float32 rounding of it: equality still holds."""
    scores = torch.full((1, 1000), -math.inf)
    scores[0, :2] = torch.tensor([0.0, math.log(9.0)])  # probabilities 0.1 and 0.9: the sum of the first is 1 - 0.9
    for top_p in (0.9, math.nextafter(0.9, 0), math.nextafter(0.9, 1)):
        _assert_bit_equal(finite_top_p(TopPLogitsWarper(top_p), scores.clone()), TopPLogitsWarper(top_p)(None, scores))


@pytest.mark.parametrize("eos", [[2], [2, 5]])
def test_suppress_eos_equals_the_processors_row_by_row(eos):
    processors = [MinLengthLogitsProcessor(12, eos), MinNewTokensLengthLogitsProcessor(8, 6, eos)]
    lengths = torch.arange(6, 18)
    scores = torch.randn(lengths.shape[0], 32, generator=torch.Generator().manual_seed(0))
    expected = torch.cat(
        [LogitsProcessorList(processors)(torch.zeros(1, int(n), dtype=torch.long), scores[i : i + 1].clone())
         for i, n in enumerate(lengths)]
    )  # fmt: skip
    _assert_bit_equal(suppress_eos(processors, lengths, scores), expected)
    assert (suppress_eos(processors, lengths, scores)[:, eos] == -math.inf).sum() == len(eos) * 8  # lengths 6..13


def test_stand_ins_only_for_exact_classes_and_checked_releases(monkeypatch):
    class MyTopP(TopPLogitsWarper):  # a subclass may do more: it runs as it is
        pass

    class MyMinLength(MinLengthLogitsProcessor):
        pass

    assert isinstance(faster(TopPLogitsWarper(0.9)), FiniteTopP)
    assert isinstance(faster(MyTopP(0.9)), MyTopP)
    assert length_only([MinLengthLogitsProcessor(3, 2), MinNewTokensLengthLogitsProcessor(1, 2, 2)])
    assert not length_only([MyMinLength(3, 2)])
    assert fast_paths_checked("5.17.0") and fast_paths_checked("5.25.0") and not fast_paths_checked("5.26.0")
    monkeypatch.setattr(fast_processors, "fast_paths_checked", lambda current=None: False)
    assert isinstance(faster(TopPLogitsWarper(0.9)), TopPLogitsWarper)
    assert not length_only([MinLengthLogitsProcessor(3, 2)])
