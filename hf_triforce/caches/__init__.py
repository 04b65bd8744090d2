"""KV caches, each a transformers ``Cache`` over :class:`~hf_triforce.caches.base.BufferedLayer` layers.

* :mod:`.retrieval`: the target's full cache with chunk summaries (:class:`RetrievalCache`);
* :mod:`.view` and :mod:`.static_view`: its sparse level-1 views (:class:`RetrievalView`, fixed-capacity form);
* :mod:`.selection`: which tokens a view keeps;
* :mod:`.streaming` and :mod:`.static_streaming`: the level-0 draft model's StreamingLLM cache;
* :mod:`.base`, :mod:`.buffers`, :mod:`.static_buffer`: the layer base and the storage under every layer.
"""

from .retrieval import RetrievalCache
from .streaming import StreamingLLMCache
from .view import RetrievalView

__all__ = ["RetrievalCache", "RetrievalView", "StreamingLLMCache"]
