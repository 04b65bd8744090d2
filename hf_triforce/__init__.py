"""hf_triforce: lossless TriForce hierarchical speculative decoding inside transformers ``generate()``.

Example:
    >>> import hf_triforce
    >>> from hf_triforce import TriForceConfig
    >>> hf_triforce.enable(model)  # doctest: +SKIP
    >>> out = model.generate(input_ids, max_new_tokens=64, triforce_config=TriForceConfig())  # doctest: +SKIP
    >>> hf_triforce.last_stats(model).to_dict()  # doctest: +SKIP

Without ``enable``, transformers' own convention for decoding methods works too:

    >>> out = model.generate(input_ids, custom_generate=hf_triforce.triforce_generate,
    ...                      triforce_config=TriForceConfig(), max_new_tokens=64)  # doctest: +SKIP

``import hf_triforce`` alone loads neither torch nor transformers (``hf-triforce --help`` stays fast): the first use
of any public name loads the package, transformers' version check and the ``enable()`` hint of
:func:`hf_triforce.hf.generate.install_enable_hint` included.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

_EXPORTS = {
    "CUSTOM_GENERATE_DIR": "generation", "disable": "generation", "enable": "generation", "is_enabled": "generation",
    "last_stats": "generation", "triforce_generate": "generation",
    "RetrievalCache": "caches", "RetrievalView": "caches", "StreamingLLMCache": "caches",
    "TriForceConfig": "config", "TriForceStats": "stats", "phase_timing": "stats",
    "InternalError": "errors", "InvalidInputError": "errors", "NoStatsError": "errors", "NotEnabledError": "errors",
    "TriForceConfigError": "errors", "TriForceError": "errors", "UnsupportedDeviceError": "errors",
    "UnsupportedGenerationError": "errors", "UnsupportedModelError": "errors",
}  # fmt: skip
"""Each public name and the module it comes from (the generation layer first: it loads the boundary with
transformers)."""

__all__ = [
    "CUSTOM_GENERATE_DIR", "InternalError", "InvalidInputError", "NoStatsError", "NotEnabledError", "RetrievalCache",
    "RetrievalView", "StreamingLLMCache", "TriForceConfig", "TriForceConfigError", "TriForceError", "TriForceStats",
    "UnsupportedDeviceError", "UnsupportedGenerationError", "UnsupportedModelError",
    "disable", "enable", "is_enabled", "last_stats", "phase_timing", "triforce_generate",
]  # fmt: skip

if TYPE_CHECKING:  # what static tools read (type checkers, the docs); at run time __getattr__ loads the same names
    from .caches import RetrievalCache, RetrievalView, StreamingLLMCache
    from .config import TriForceConfig
    from .errors import (
        InternalError,
        InvalidInputError,
        NoStatsError,
        NotEnabledError,
        TriForceConfigError,
        TriForceError,
        UnsupportedDeviceError,
        UnsupportedGenerationError,
        UnsupportedModelError,
    )
    from .generation import CUSTOM_GENERATE_DIR, disable, enable, is_enabled, last_stats, triforce_generate
    from .stats import TriForceStats, phase_timing


def __getattr__(name: str) -> Any:
    """Load the package on the first use of a public name (PEP 562), then serve every name from the module."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_triforce' has no attribute {name!r}")
    for exported, module in _EXPORTS.items():
        globals()[exported] = getattr(importlib.import_module(f".{module}", __name__), exported)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
