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

from .caches import RetrievalCache, RetrievalView, StreamingLLMCache
from .config import TriForceConfig
from .errors import (
    InternalError,
    InvalidInputError,
    NoStatsError,
    TriForceConfigError,
    TriForceError,
    UnsupportedDeviceError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from .generation import CUSTOM_GENERATE_DIR, disable, enable, is_enabled, last_stats, triforce_generate
from .stats import TriForceStats, phase_timing

__version__ = "0.3.0"

__all__ = [
    "CUSTOM_GENERATE_DIR", "InternalError", "InvalidInputError", "NoStatsError", "RetrievalCache", "RetrievalView",
    "StreamingLLMCache", "TriForceConfig", "TriForceConfigError", "TriForceError", "TriForceStats",
    "UnsupportedDeviceError", "UnsupportedGenerationError", "UnsupportedModelError",
    "disable", "enable", "is_enabled", "last_stats", "phase_timing", "triforce_generate",
]  # fmt: skip
