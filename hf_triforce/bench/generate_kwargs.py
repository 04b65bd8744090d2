"""The ``generate()`` arguments of a run at a temperature: greedy at 0, sampling above.

Example:
    >>> generate_kwargs(64)
    {'max_new_tokens': 64, 'do_sample': False}
    >>> generate_kwargs(64, temperature=0.6, top_p=0.9, min_new_tokens=64)
    {'max_new_tokens': 64, 'min_new_tokens': 64, 'do_sample': True, 'temperature': 0.6, 'top_p': 0.9}
"""

from __future__ import annotations

from typing import Any


def generate_kwargs(
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    *,
    min_new_tokens: int | None = None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``model.generate()`` for ``max_new_tokens`` tokens at ``temperature``.

    Args:
        max_new_tokens: tokens to generate at most.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: nucleus threshold when sampling.
        min_new_tokens: force at least this many tokens (a benchmark's fixed length), if given.
        top_k: top-k threshold when sampling, if given (``0`` switches off ``generate()``'s default of 50).

    Returns:
        ``{"max_new_tokens", ["min_new_tokens"], "do_sample", ["temperature", "top_p", ["top_k"]]}``.

    Example:
        >>> generate_kwargs(8, temperature=1.0, top_k=0)["top_k"]
        0
    """
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if min_new_tokens is not None:
        kwargs["min_new_tokens"] = min_new_tokens
    if temperature <= 0:
        return {**kwargs, "do_sample": False}
    kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
    if top_k is not None:
        kwargs["top_k"] = top_k
    return kwargs
