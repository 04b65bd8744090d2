"""KV caches: the target's full retrieval cache (with sparse views) and the draft's StreamingLLM cache."""

from .retrieval import RetrievalCache, RetrievalView
from .streaming import StreamingLLMCache

__all__ = ["RetrievalCache", "RetrievalView", "StreamingLLMCache"]
