"""KV caches, each a transformers ``Cache`` over :class:`~hf_triforce.caches.base.BufferedLayer` layers."""

from .retrieval import RetrievalCache
from .streaming import StreamingLLMCache
from .view import RetrievalView

__all__ = ["RetrievalCache", "RetrievalView", "StreamingLLMCache"]
