"""What a caller's cache is: one they passed (not the empty one ``generate()`` makes), and of which kind.

``generate()`` marks the caller's cache with the private flag ``_is_user_defined`` (5.17 to 5.24).
"""

from __future__ import annotations

from typing import Any

from transformers import Cache, DynamicCache, DynamicLayer

from .versions import find_cache


def callers_cache(model_kwargs: dict[str, Any]) -> Any | None:
    """The cache the caller passed to ``generate()`` (empty ones too), not one ``generate()`` made; or ``None``."""
    cache = find_cache(model_kwargs)[1]
    return cache if getattr(cache, "_is_user_defined", False) else None


def plain_kv_layers(cache: Any) -> bool:
    """Whether ``cache`` is a ``DynamicCache`` of full-attention, in-memory ``DynamicLayer`` layers.

    Example:
        >>> plain_kv_layers(DynamicCache()), plain_kv_layers(None)
        (True, False)
    """
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def describe(cache: Any) -> str:
    """A short name for an error message: the class, offloading and the layer kinds."""
    if not isinstance(cache, Cache):
        return type(cache).__name__
    kinds = sorted({type(layer).__name__ for layer in cache.layers})
    offloaded = " (offloaded)" if getattr(cache, "offloading", False) else ""
    return f"{type(cache).__name__}{offloaded} with {', '.join(kinds) or 'no'} layers"
