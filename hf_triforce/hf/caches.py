"""What a caller's cache is: one they passed (``generate()`` marks it ``_is_user_defined``), and of which kind."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache, DynamicCache, DynamicLayer
from transformers.cache_utils import DynamicSlidingWindowLayer

from .versions import find_cache


def callers_cache(model_kwargs: dict[str, Any]) -> Any | None:
    """The cache the caller passed to ``generate()`` (empty ones too), not one ``generate()`` made; or ``None``."""
    cache = find_cache(model_kwargs)[1]
    return cache if getattr(cache, "_is_user_defined", False) else None


def plain_kv_layers(cache: Any, windows: list[int | None] | None = None) -> bool:
    """Whether ``cache`` is an in-memory ``DynamicCache`` of ``DynamicLayer`` layers (every token) or, where the
    model's layer slides through a window (``windows``, :func:`~hf_triforce.hf.model.layer_windows`), a
    ``DynamicSlidingWindowLayer`` of that window holding what its next query sees.

    Example:
        >>> plain_kv_layers(DynamicCache()), plain_kv_layers(None)
        (True, False)
    """
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return False
    windows = windows or []
    for i, layer in enumerate(cache.layers):
        window = windows[i] if i < len(windows) else None
        if type(layer) is DynamicSlidingWindowLayer:
            if window is None or layer.sliding_window != window:
                return False
            held = layer.keys.shape[-2] if layer.is_initialized and layer.keys.dim() == 4 else 0
            if held < min(layer.get_seq_length(), window - 1):
                return False
        elif type(layer) is not DynamicLayer:
            return False
    return True


def set_window_layer(layer: Any, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
    """A caller's ``DynamicSlidingWindowLayer`` now holds ``keys``/``values``, the last of ``length`` tokens."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values, layer.cumulative_length = keys, values, length


def describe(cache: Any) -> str:
    """A short name for an error message: the class, offloading and the layer kinds."""
    if not isinstance(cache, Cache):
        return type(cache).__name__
    kinds = sorted({type(layer).__name__ for layer in cache.layers})
    offloaded = " (offloaded)" if getattr(cache, "offloading", False) else ""
    return f"{type(cache).__name__}{offloaded} with {', '.join(kinds) or 'no'} layers"
