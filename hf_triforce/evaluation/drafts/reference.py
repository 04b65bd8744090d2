"""The full-cache reference: a prompt prefilled once, continuations decoded token by token with the full cache.

Each step records what the evaluation compares sparse views against: the full-cache logits of the next
token (the verifier's ``p``) and the post-RoPE query of every layer (what retrieval selects with). The
continuation is greedy at ``T = 0`` and sampled from the processed full-cache distribution otherwise,
i.e. a sample of exactly what ``generate()`` (and, being lossless, TriForce) produces.

Example:
    >>> cache, prefill = prefill_prompt(model, ids)  # doctest: +SKIP
    >>> ref = decode_reference(model, cache, prefill, new_tokens=64, temperature=0.0)  # doctest: +SKIP
    >>> ref.tokens.shape, ref.logits.shape  # doctest: +SKIP
    (torch.Size([64]), torch.Size([64, 49152]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...caches.retrieval import RetrievalCache
from ...hf.attention import QueryCapture, capturing_queries
from ...hf.linears import small_batch_linears
from ...hf.model import num_layers
from ...hf.progress import prefill_progress
from ...hf.versions import cache_kwargs
from .acceptance import processed_probs


@dataclass
class Prefill:
    """The prompt's last-position full-cache logits ``[V]`` and per-layer queries ``[L, H_q, D]``."""

    prompt: torch.LongTensor
    logits: torch.Tensor
    queries: torch.Tensor


@dataclass
class Reference:
    """A continuation of a prefilled prompt and what the full cache computed along it.

    Attributes:
        prompt: ``[n]`` prompt ids.
        tokens: ``[m]`` continuation ``y_0 .. y_{m-1}``.
        logits: ``[m, V]`` full-cache raw logits; row ``j`` is the distribution ``y_j`` was drawn from.
        queries: ``[L, m, H_q, D]`` per-layer queries; ``[:, j]`` is the query of position ``n - 1 + j``
            (the prompt's last token for ``j = 0``, else ``y_{j-1}``).
        temperature: 0 (greedy) or the sampling temperature.
    """

    prompt: torch.LongTensor
    tokens: torch.LongTensor
    logits: torch.Tensor
    queries: torch.Tensor
    temperature: float

    @property
    def prompt_length(self) -> int:
        return self.prompt.shape[0]

    def query(self, j: int) -> list[torch.Tensor]:
        """Per-layer ``[1, H_q, D]`` query of position ``n - 1 + j``."""
        return [q[j][None] for q in self.queries]

    def sequence(self) -> torch.LongTensor:
        """``[n + m]`` prompt and continuation."""
        return torch.cat([self.prompt, self.tokens])


def new_cache(model, capacity: int) -> RetrievalCache:
    """An empty :class:`RetrievalCache` for ``model`` with room for ``capacity`` tokens."""
    return RetrievalCache(num_layers(model), chunk_size=8, capacity=capacity)


def prefill_prompt(model, prompt: torch.LongTensor, capacity: int | None = None) -> tuple[RetrievalCache, Prefill]:
    """Prefill ``prompt`` (``[1, n]``) into a new full cache in one forward; returns the cache and the last step.

    Example:
        >>> cache, prefill = prefill_prompt(model, ids)  # doctest: +SKIP
    """
    n = prompt.shape[1]
    cache = new_cache(model, capacity or n + 256)
    logits, queries = _step(model, cache, prompt, 0)
    return cache, Prefill(prompt[0], logits, queries)


def decode_reference(
    model,
    cache: RetrievalCache,
    prefill: Prefill,
    new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    eos_token_ids: list[int] | None = None,
) -> Reference:
    """Decode up to ``new_tokens`` tokens after the prefilled prompt, one full-cache forward per token.

    Stops after an end-of-sequence token. On return ``cache`` holds the prompt and every continuation
    token but the last (as during generation); crop it back (``cache.crop(-(m - 1))``) to decode another
    continuation of the same prompt.

    Args:
        model: the target model.
        cache: the cache :func:`prefill_prompt` returned, holding exactly the prompt.
        prefill: what :func:`prefill_prompt` returned.
        new_tokens: continuation length ``m`` (at most).
        temperature: 0 for greedy, else sample from the processed full-cache distribution.
        top_p: nucleus threshold when sampling.
        generator: random generator for sampling.
        eos_token_ids: tokens that end the continuation.

    Returns:
        a :class:`Reference`.
    """
    n = prefill.prompt.shape[0]
    if cache.get_seq_length() != n:
        raise ValueError(f"the cache holds {cache.get_seq_length()} tokens, not the {n}-token prompt: crop it first.")
    logits, queries, tokens = [prefill.logits], [prefill.queries], []
    for j in range(new_tokens):
        token = _choose(logits[-1], temperature, top_p, generator)
        tokens.append(token)
        if j + 1 == new_tokens or token in (eos_token_ids or ()):
            break
        step_logits, step_queries = _step(model, cache, torch.tensor([[token]]), n + j)
        logits.append(step_logits)
        queries.append(step_queries)
    return Reference(
        prompt=prefill.prompt,
        tokens=torch.tensor(tokens, dtype=torch.long),
        logits=torch.stack(logits),
        queries=torch.stack(queries, dim=1),
        temperature=temperature,
    )


def _step(model, cache: RetrievalCache, tokens: torch.LongTensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``tokens`` ``[1, q]`` from position ``start`` into ``cache``.

    Returns the last position's logits ``[V]`` and per-layer queries ``[L, H_q, D]``.
    """
    capture = QueryCapture()
    positions = torch.arange(start, start + tokens.shape[1])[None]
    with (
        torch.inference_mode(),
        small_batch_linears(model),
        prefill_progress(model, tokens.shape[1]),
        capturing_queries(model, capture, keep=1) as capture_kwargs,
    ):
        out = model(
            input_ids=tokens,
            position_ids=positions,
            **cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1,
            **capture_kwargs,
        )
    queries = torch.stack([q[0] for q in capture.at(-1)])
    return out.logits[0, -1].float(), queries


def _choose(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = processed_probs(logits[None], temperature, top_p)[0]
    return int(torch.multinomial(probs, 1, generator=generator))
