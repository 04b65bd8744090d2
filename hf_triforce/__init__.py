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
"""

import warnings

from .caches import RetrievalCache, RetrievalView, StreamingLLMCache
from .config import TriForceConfig
from .errors import (
    TriForceConfigError,
    TriForceError,
    UnsupportedDeviceError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from .generation import CUSTOM_GENERATE_DIR, disable, enable, is_enabled, last_stats, triforce_generate
from .hf.model import SUPPORTED_MODEL_TYPES
from .stats import TriForceStats

__version__ = "0.2.0.dev0"

__all__ = [
    "CUSTOM_GENERATE_DIR",
    "SUPPORTED_MODEL_TYPES",
    "RetrievalCache",
    "RetrievalView",
    "StreamingLLMCache",
    "TriForceConfig",
    "TriForceConfigError",
    "TriForceError",
    "TriForceStats",
    "UnsupportedDeviceError",
    "UnsupportedGenerationError",
    "UnsupportedModelError",
    "disable",
    "enable",
    "is_enabled",
    "last_stats",
    "triforce_generate",
]


def __getattr__(name: str):
    """``TriForceCandidateGenerator`` (0.1) is :class:`hf_triforce.hierarchy.Level1Drafter`; removed in 0.3."""
    if name == "TriForceCandidateGenerator":
        warnings.warn(
            "hf_triforce.TriForceCandidateGenerator is now hf_triforce.hierarchy.Level1Drafter (it never was driven "
            "by transformers' assisted generation, and its methods are draft/observe_verification); the old name is "
            "removed in hf_triforce 0.3.",
            FutureWarning,
            stacklevel=2,
        )
        from .hierarchy import Level1Drafter

        return Level1Drafter
    raise AttributeError(f"module 'hf_triforce' has no attribute {name!r}")
