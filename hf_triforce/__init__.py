"""hf_triforce: lossless TriForce hierarchical speculative decoding inside transformers ``generate()``.

Example:
    >>> import hf_triforce
    >>> from hf_triforce import TriForceConfig
    >>> hf_triforce.enable(model)  # doctest: +SKIP
    >>> out = model.generate(input_ids, max_new_tokens=64, triforce_config=TriForceConfig())  # doctest: +SKIP
    >>> hf_triforce.last_stats(model).to_dict()  # doctest: +SKIP
"""

from .caches import RetrievalCache, RetrievalView, StreamingLLMCache
from .config import TriForceConfig
from .drafting import TriForceCandidateGenerator
from .errors import (
    TriForceConfigError,
    TriForceError,
    UnsupportedDeviceError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from .integration import SUPPORTED_MODEL_TYPES, disable, enable
from .stats import TriForceStats

__version__ = "0.1.0"


def last_stats(model) -> TriForceStats:
    """Statistics of the model's most recent TriForce ``generate()`` call.

    Raises:
        ValueError: when no TriForce generation has run on this model.
    """
    stats = getattr(model, "_hf_triforce_last_stats", None)
    if stats is None:
        raise ValueError(
            "No TriForce generation has run on this model yet: call model.generate(..., triforce_config=...)."
        )
    return stats


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "RetrievalCache",
    "RetrievalView",
    "StreamingLLMCache",
    "TriForceCandidateGenerator",
    "TriForceConfig",
    "TriForceConfigError",
    "TriForceError",
    "TriForceStats",
    "UnsupportedDeviceError",
    "UnsupportedGenerationError",
    "UnsupportedModelError",
    "disable",
    "enable",
    "last_stats",
]
