"""The supported transformers range, and the names that differ between its releases: 5.24 renamed the cache argument
``past_key_values`` to ``cache`` (the old name warns); hf_triforce passes :data:`CACHE_ARG` and looks for a user's
cache under both names (:data:`CACHE_ARGS`)."""

from __future__ import annotations

from typing import Any

import transformers
from packaging import version

MIN_TRANSFORMERS = "5.17"
"""Lowest supported (and tested) release."""
MAX_TRANSFORMERS = "6"
"""First unsupported transformers release."""
CACHE_RENAMED_IN = "5.24"
"""The release that renamed ``past_key_values`` to ``cache``."""


def check_transformers_version(current: str | None = None) -> None:
    """Raise ``ImportError`` unless ``MIN_TRANSFORMERS <= transformers < MAX_TRANSFORMERS``."""
    current = current or transformers.__version__
    v = version.parse(current)
    if not version.parse(MIN_TRANSFORMERS) <= v < version.parse(MAX_TRANSFORMERS):
        raise ImportError(
            f"hf_triforce needs transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}; found {current}. "
            f"Run: pip install 'transformers>={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS}'"
        )


def cache_argument(current: str | None = None) -> str:
    """The name of the cache argument of ``forward()``/``generate()`` (and of the output field) in a release."""
    v = version.parse(current or transformers.__version__)
    return "cache" if v >= version.parse(CACHE_RENAMED_IN) else "past_key_values"


check_transformers_version()

CACHE_ARG = cache_argument()
"""The installed release's cache argument: ``"cache"`` (>= 5.24) or ``"past_key_values"``."""
CACHE_ARGS = ("cache", "past_key_values")
"""Every name a caller's cache may arrive under."""


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{CACHE_ARG: cache}``: a cache for ``forward()`` under the installed release's name."""
    return {CACHE_ARG: cache}


def find_cache(kwargs: dict[str, Any]) -> tuple[str, Any] | tuple[None, None]:
    """``(name, cache)`` of the cache in a call's ``kwargs`` under any name, or ``(None, None)``."""
    for name in CACHE_ARGS:
        if kwargs.get(name) is not None:
            return name, kwargs[name]
    return None, None


def output_cache(output: Any) -> Any:
    """The cache a model or ``generate()`` output carries (``.cache`` since 5.24, ``.past_key_values`` before)."""
    return getattr(output, CACHE_ARG)


def cache_layer_types(config: Any) -> list[str]:
    """The KV-cache layer kind of each decoder layer of a text ``config``, as transformers builds a ``DynamicCache``
    (``cache_utils.get_layer_types_and_kwargs``, 5.24; before it, its rule read off the config).

    Example:
        >>> from transformers import MistralConfig
        >>> cache_layer_types(MistralConfig(num_hidden_layers=2, sliding_window=64))
        ['sliding_attention', 'sliding_attention']
    """
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            return list(layer_types)
        if getattr(config, "sliding_window", None) is not None:
            return ["sliding_attention"] * config.num_hidden_layers
        if getattr(config, "attention_chunk_size", None) is not None:
            return ["chunked_attention"] * config.num_hidden_layers
        return ["full_attention"] * config.num_hidden_layers
    return list(get_layer_types_and_kwargs(config)[0])


def flash_attention_available(generation: int) -> bool:
    """Whether the ``flash_attn`` package of FlashAttention ``generation`` (2 or 3) is installed."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    return (is_flash_attn_2_available if generation == 2 else is_flash_attn_3_available)()


def compile_on_any_device(config: transformers.CompileConfig) -> transformers.CompileConfig | None:
    """``config`` marked so that ``generate()`` compiles on a CPU too (a flag that is not a constructor argument), or
    ``None`` on a release without that flag.

    Example:
        >>> compile_on_any_device(transformers.CompileConfig(mode="default")) is not None
        True
    """
    if not hasattr(config, "_compile_all_devices"):
        return None
    config._compile_all_devices = True  # read by generate()'s auto-compile check
    return config
