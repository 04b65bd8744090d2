"""Level-1 view policies: which tokens of the full cache a sparse view keeps, and when it re-selects.

A :class:`ViewPolicy` is either the package's retrieval selection (sink chunk + top-scoring chunks +
recent window, :func:`hf_triforce.caches.selection.select_token_indices`) or a StreamingLLM view of the
same budget. For the evaluation it also varies what ``TriForceConfig`` fixes: how the queries of a GQA
group are combined into one chunk score (:func:`group_scores`), the chunk size, the recent window, the
refresh stride and the refresh on falling acceptance.

Example:
    >>> ViewPolicy(budget=512, refresh_every=32).label
    'retrieval b512 c8 w128 a1 x4 sum r32'
    >>> ViewPolicy(kind="streaming", budget=512, refresh_every=32).label
    'streaming b512 s8 r32'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from ...caches.retrieval import RetrievalCache
from ...caches.selection import rescore, select_token_indices
from ...config import TriForceConfig
from ...errors import TriForceConfigError
from ...hierarchy.schedule import RefreshRule
from ...kernels.retrieval import chunk_means, score_chunks
from .streaming_view import streaming_indices

KINDS = ("retrieval", "streaming")
COMBINES = ("sum", "max", "softmax", "attention")
NEVER = 2**31 - 1  # refresh_every that never re-selects
CONFIG_KNOBS = (
    "chunk_size",
    "recent_window",
    "lookahead_chunks",
    "rescore_candidates",
    "refresh_every",
    "refresh_below_acceptance",
)
"""The ``TriForceConfig`` knobs a :class:`ViewPolicy` carries, under the config's own names."""
_DEFAULTS = TriForceConfig()


@dataclass(frozen=True)
class ViewPolicy:
    """How a level-1 view is chosen and refreshed (defaults: ``TriForceConfig()``'s).

    Both kinds follow the same refresh schedule, so a StreamingLLM view also sees the tokens cached since
    its last re-selection: both views hold the same number of tokens at every position.

    Attributes:
        kind: ``"retrieval"`` (query-aware chunks) or ``"streaming"`` (sinks + recent window).
        budget: tokens of the full cache in the view (both kinds).
        chunk_size: retrieval chunk size.
        recent_window: retrieval: recent tokens always kept (``'auto'``, the default, becomes the config's: a
            quarter of the budget, :attr:`TriForceConfig.recent_tokens`).
        lookahead_chunks: retrieval: chunks after each top-scoring chunk that share its score.
        rescore_candidates: retrieval: the summaries nominate this many times the chunks the view holds, ranked
            then by their keys (0: off; :func:`~hf_triforce.caches.selection.rescore`).
        combine: retrieval: how a GQA group's query heads score a chunk (see :func:`group_scores`).
        refresh_every: re-select after this many new tokens (``NEVER``: select once).
        refresh_below_acceptance: also re-select when a round's acceptance falls below this (None: off).
        sinks: streaming: attention-sink tokens.
    """

    kind: str = "retrieval"
    budget: int = 512
    chunk_size: int = _DEFAULTS.chunk_size
    recent_window: int | str = _DEFAULTS.recent_window
    lookahead_chunks: int = _DEFAULTS.lookahead_chunks
    rescore_candidates: int = _DEFAULTS.rescore_candidates
    combine: str = "sum"
    refresh_every: int = _DEFAULTS.refresh_every
    refresh_below_acceptance: float | None = _DEFAULTS.refresh_below_acceptance
    sinks: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TriForceConfigError(f"view kind {self.kind!r} is not one of {KINDS}.")
        if self.combine not in COMBINES:
            raise TriForceConfigError(f"combine={self.combine!r} is not one of {COMBINES}.")
        if self.kind == "retrieval":  # the package's own validation of budget / chunk / window
            config = TriForceConfig(retrieval_budget=self.budget, **self._config_knobs())
            object.__setattr__(self, "recent_window", config.recent_tokens)  # frozen: 'auto' resolved once
        elif not 0 <= self.sinks < self.budget:
            raise TriForceConfigError(f"streaming sinks={self.sinks} must be in [0, budget={self.budget}).")

    @classmethod
    def from_config(cls, config: TriForceConfig, budget: int | None = None) -> ViewPolicy:
        """The retrieval policy a ``TriForceConfig`` runs (its budget unless ``budget`` is given); a config with
        ``step_selection=True`` raises ``ValueError`` (a replay of one selection per refresh cannot model it).

        Example:
            >>> policy = ViewPolicy.from_config(TriForceConfig(), budget=256)
            >>> policy.budget, policy.recent_window  # the default 'auto' window: a quarter of the budget
            (256, 64)
        """
        if config.step_selection:
            raise ValueError(
                "ViewPolicy replays one selection per refresh; it does not model TriForceConfig(step_selection=True) "
                "(each layer re-ranking inside level 1's forward): measure that with the real generate() call "
                "(benchmarks/experiments/step_selection_ab.py), or pass step_selection=False."
            )
        knobs = {name: getattr(config, name) for name in CONFIG_KNOBS}  # an 'auto' window follows ``budget``
        return cls(budget=config.retrieval_budget if budget is None else budget, **knobs)

    def refresh_rule(self) -> RefreshRule:
        """The package's re-selection schedule (:class:`~hf_triforce.hierarchy.schedule.RefreshRule`) for this
        policy's ``refresh_every`` and ``refresh_below_acceptance`` (of either kind).

        Example:
            >>> ViewPolicy(refresh_every=32).refresh_rule().due(tokens_since_selection=31)
            False
        """
        knobs = {"refresh_every": self.refresh_every, "refresh_below_acceptance": self.refresh_below_acceptance}
        return RefreshRule(TriForceConfig(**knobs))

    def _config_knobs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CONFIG_KNOBS}

    def with_(self, **changes: Any) -> ViewPolicy:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def label(self) -> str:
        """A short human-readable name."""
        refresh = "never" if self.refresh_every >= NEVER else str(self.refresh_every)
        if self.kind == "streaming":
            return f"streaming b{self.budget} s{self.sinks} r{refresh}"
        below = "" if self.refresh_below_acceptance is None else f" below{self.refresh_below_acceptance:g}"
        ahead = f" a{self.lookahead_chunks}" if self.lookahead_chunks else ""
        ahead += f" x{self.rescore_candidates}" if self.rescore_candidates else ""
        return (
            f"retrieval b{self.budget} c{self.chunk_size} w{self.recent_window}{ahead} {self.combine} r{refresh}{below}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; ``refresh_every`` is ``None`` for never."""
        out = asdict(self)
        out["refresh_every"] = None if self.refresh_every >= NEVER else self.refresh_every
        return out


def group_scores(query: torch.Tensor, summaries: torch.Tensor, combine: str = "sum") -> torch.Tensor:
    """Chunk scores ``[B, H_kv, C]`` for each KV head from the ``H_q / H_kv`` query heads of its group.

    * ``"sum"``: ``sum_g q_g . s`` (the package's :func:`~hf_triforce.caches.selection.score_chunks`; the
      same as scoring with the group's summed query).
    * ``"max"``: ``max_g q_g . s``: a chunk counts if any head of the group wants it.
    * ``"softmax"``: ``sum_g softmax_c(q_g . s / sqrt(D))``: every head contributes an attention-like
      distribution of total 1, so a head with large logits cannot drown the others.
    * ``"attention"`` is not a function of the summaries: see :func:`attention_mass` (:func:`select_indices`
      routes it there).

    Args:
        query: ``[B, H_q, D]`` post-RoPE query of the newest cached token.
        summaries: ``[B, H_kv, C, D]`` chunk summaries (mean keys).
        combine: one of ``COMBINES``.

    Example:
        >>> q, s = torch.randn(1, 4, 8), torch.randn(1, 2, 5, 8)
        >>> torch.allclose(group_scores(q, s, "sum"), score_chunks(q, s))
        True
    """
    if combine == "sum":
        return score_chunks(query, summaries)
    b, hq, d = query.shape
    hkv = summaries.shape[1]
    grouped = query.reshape(b, hkv, hq // hkv, d).to(summaries.dtype)
    per_head = torch.einsum("bhgd,bhcd->bhgc", grouped, summaries)  # [B, H_kv, group, C]
    if combine == "max":
        return per_head.amax(dim=2)
    if combine == "softmax":
        return (per_head / math.sqrt(d)).softmax(dim=-1).sum(dim=2)
    if combine == "attention":
        raise TriForceConfigError("combine='attention' scores the keys, not the summaries: call attention_mass.")
    raise TriForceConfigError(f"combine={combine!r} is not one of {COMBINES}.")


def attention_mass(query: torch.Tensor, keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Exact attention of the query over the complete chunks' keys, summed per chunk and over the GQA group.

    ``out[b, h, c] = sum_g sum_{t in chunk c} softmax_t(q_g . k_t / sqrt(D))``: the attention mass the full
    cache gives each chunk (over the keys of complete chunks), which no chunk summary can beat at ranking
    chunks for this query. The evaluation's ``combine="attention"`` uses it as the ceiling of chunk scoring
    (it reads every key, as the verification forward does; the package's selection reads one mean key per
    chunk).

    Args:
        query: ``[B, H_q, D]`` post-RoPE query of the newest cached token.
        keys: ``[B, H_kv, L, D]`` post-RoPE keys; a trailing partial chunk is left out.
        chunk_size: tokens per chunk.

    Returns:
        ``[B, H_kv, L // chunk_size]`` float32 masses (each KV head's sum to ``H_q / H_kv``).

    Example:
        >>> mass = attention_mass(torch.randn(1, 4, 8), torch.randn(1, 2, 35, 8), 8)
        >>> mass.shape, torch.allclose(mass.sum(-1), torch.full((1, 2), 2.0))
        (torch.Size([1, 2, 4]), True)
    """
    b, hq, d = query.shape
    hkv, n = keys.shape[1], keys.shape[2] // chunk_size
    grouped = query.reshape(b, hkv, hq // hkv, d).float()
    logits = torch.einsum("bhgd,bhld->bhgl", grouped, keys[:, :, : n * chunk_size].float()) / math.sqrt(d)
    return logits.softmax(dim=-1).reshape(b, hkv, hq // hkv, n, chunk_size).sum(dim=(2, 4))


def select_indices(
    cache: RetrievalCache, queries: list[torch.Tensor], length: int, policy: ViewPolicy
) -> list[torch.Tensor]:
    """Per-layer ``[1, H_kv, S]`` token indices of the view of the first ``length`` cached tokens.

    Retrieval reuses the cache's chunk summaries (or :func:`chunk_means` for another chunk size) and
    :func:`select_token_indices`, as :meth:`RetrievalCache.select` does, but at an earlier ``length`` than
    the cache holds, so one filled cache serves every position of a continuation.

    Args:
        cache: the full cache (holding at least ``length`` tokens).
        queries: per-layer ``[1, H_q, D]`` query of token ``length - 1`` (the newest cached token).
        length: tokens visible to the selection.
        policy: the :class:`ViewPolicy`.

    Example:
        >>> idx = select_indices(cache, queries, 4000, ViewPolicy(budget=512))  # doctest: +SKIP
        >>> idx[0].shape[-1] <= 512  # doctest: +SKIP
        True
    """
    indices = []
    for layer, query in zip(cache.layers, queries, strict=True):
        kv_heads = layer.buffer.keys.shape[1]
        if policy.kind == "streaming":
            indices.append(streaming_indices(length, policy.budget, policy.sinks, kv_heads, query.device))
            continue
        c = policy.chunk_size
        if length <= policy.budget:
            scores = query.new_zeros(1, kv_heads, 0)
        elif policy.combine == "attention":
            scores = attention_mass(query, layer.buffer.keys[:, :, :length], c)
        else:
            scores = group_scores(query, _summaries(layer, length, c, cache.chunk_size), policy.combine)
        if policy.rescore_candidates and length > policy.budget:
            layout = (length, c, policy.budget, policy.recent_window)
            scores = rescore(scores, query, layer.buffer.keys, *layout, policy.rescore_candidates)
        indices.append(
            select_token_indices(scores, length, c, policy.budget, policy.recent_window, policy.lookahead_chunks)
        )
    return indices


def _summaries(layer, length: int, chunk_size: int, cache_chunk_size: int) -> torch.Tensor:
    """``[1, H_kv, length // chunk_size, D]`` mean keys of the complete chunks before ``length``."""
    if chunk_size == cache_chunk_size:
        return layer.summaries()[:, :, : length // chunk_size]
    return chunk_means(layer.buffer.keys[:, :, :length], chunk_size)
