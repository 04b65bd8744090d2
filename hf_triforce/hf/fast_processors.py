"""Bit-exact faster equivalents of transformers' top-p and minimum-length processors, copies of its implementation
(unchanged from 5.17 to 5.25), not used from :data:`CHECKED_BELOW` on (:func:`fast_paths_checked`)."""

from __future__ import annotations

import math

import torch
import transformers
from packaging import version

CHECKED_BELOW = "5.26"
"""First transformers release whose processors these equivalents were not checked against."""
FINITE_LIMIT = 1024
"""Most finite scores per row :func:`finite_top_p` sorts itself; more go through transformers' full sort."""
LENGTH_ONLY = (transformers.MinLengthLogitsProcessor, transformers.MinNewTokensLengthLogitsProcessor)
"""Processor classes that read only the context's length (matched exactly: a subclass may read more)."""


def fast_paths_checked(current: str | None = None) -> bool:
    """Whether the installed transformers is one these equivalents were checked against."""
    return version.parse(current or transformers.__version__) < version.parse(CHECKED_BELOW)


def length_only(processors) -> bool:
    """Whether :func:`suppress_eos` serves ``processors`` (all :data:`LENGTH_ONLY`, transformers checked)."""
    return fast_paths_checked() and all(type(p) in LENGTH_ONLY for p in processors)


def suppress_eos(processors, lengths: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``[P, V]`` ``scores`` processed by the :data:`LENGTH_ONLY` ``processors``, row ``i`` with a context of
    ``lengths[i]`` (``[P]``) tokens; returns a new tensor."""
    out = scores.clone()
    for processor in processors:
        eos = processor.eos_token_id.to(scores.device).flatten()
        eos = eos[(eos >= 0) & (eos < scores.shape[-1])]  # isin over the vocabulary ignores the others
        short = (lengths.to(scores.device) < _minimum_length(processor)).nonzero()
        out[short, eos[None]] = -math.inf
    return out


def _minimum_length(processor) -> int:
    """The context length below which ``processor`` suppresses end-of-sequence."""
    if type(processor) is transformers.MinNewTokensLengthLogitsProcessor:
        return processor.prompt_length_to_skip + processor.min_new_tokens
    return processor.min_length


def finite_top_p(warper: transformers.TopPLogitsWarper, scores: torch.Tensor) -> torch.Tensor:
    """``warper(input_ids, scores)`` for ``[P, V]`` scores, bit for bit, sorting only each row's finite scores.

    Transformers' ascending sort is ``V - m`` times ``-inf`` then the top ``m`` ascending: built here from one ``topk``,
    it is the same tensor, so the same kernels give the same sums. Ties among finite scores, NaN, ``+inf``, another
    filter value or more than :data:`FINITE_LIMIT` finite scores go to ``warper`` itself."""
    top = _finite_top(warper, scores)
    if top is None:
        return warper(None, scores)
    values, indices = top[0].flip(-1), top[1].flip(-1)
    m = values.shape[-1]
    sorted_logits = scores.new_full(scores.shape, -math.inf)
    sorted_logits[:, scores.shape[-1] - m :] = values
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - warper.top_p)
    remove[..., -warper.min_tokens_to_keep :] = False
    return scores.scatter(-1, indices, values.masked_fill(remove[:, scores.shape[-1] - m :], warper.filter_value))


def _finite_top(warper, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(values, indices)`` ``[P, m]`` of each row's ``m`` largest scores, descending (``m``: the most finite
    scores of any row); ``None`` where :func:`finite_top_p` must use transformers (NaN, ``+inf``)."""
    if scores.dim() != 2 or warper.filter_value != -math.inf or scores.numel() == 0:
        return None
    k = min(scores.shape[-1], 64)
    values, indices = scores.topk(k, dim=-1)
    while torch.isfinite(values[:, -1]).any() and k < scores.shape[-1]:  # a row may hold more finite scores
        if k >= FINITE_LIMIT:
            return None
        k = min(scores.shape[-1], 4 * k)
        values, indices = scores.topk(k, dim=-1)
    finite = torch.isfinite(values)
    if not finite[:, 0].all() or ((values[:, 1:] == values[:, :-1]) & finite[:, 1:]).any():
        return None  # NaN, +inf or a row of -inf only; or ties among finite scores (a sort leaves their order open)
    m = int(finite.sum(-1).max())
    return values[:, :m], indices[:, :m]


class FiniteTopP:
    """A :class:`~transformers.TopPLogitsWarper` that sorts only the finite scores (:func:`finite_top_p`)."""

    def __init__(self, warper: transformers.TopPLogitsWarper) -> None:
        self.warper = warper

    def __call__(self, input_ids, scores: torch.Tensor) -> torch.Tensor:
        return finite_top_p(self.warper, scores)


def faster(processor):
    """``processor``, or its faster exact stand-in where one exists and was checked (top-p today)."""
    if type(processor) is transformers.TopPLogitsWarper and fast_paths_checked():
        return FiniteTopP(processor)
    return processor
