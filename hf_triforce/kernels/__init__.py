"""Fast paths, each beside the pure-torch (or transformers) computation it must equal.

* :mod:`.retrieval`: chunk summaries and scores, the gather into a sparse view (references + Triton kernels);
* :mod:`.verification`: split-KV attention of the full-cache verification (reference + Triton kernel);
* :mod:`.attention`: grouped-query SDPA without ``repeat_kv`` copies (reference: transformers' sdpa);
* :mod:`.linear`: few-row linears on the CPU (reference: ``F.linear``);
* :mod:`.dispatch` (when a kernel runs) and :mod:`.guard` (a kernel that cannot compile falls back).

Pure torch: nothing here imports transformers or the rest of hf_triforce.
"""

from .attention import gqa_sdpa_attention
from .dispatch import triton_enabled
from .retrieval import (
    chunk_means,
    chunk_scores,
    gather_kv_into,
    gather_kv_triton,
    gather_tokens,
    score_chunks,
    score_chunks_triton,
)
from .verification import verify_attention, verify_attention_reference, verify_attention_triton

__all__ = [
    "chunk_means",
    "chunk_scores",
    "gather_kv_into",
    "gather_kv_triton",
    "gather_tokens",
    "gqa_sdpa_attention",
    "score_chunks",
    "score_chunks_triton",
    "triton_enabled",
    "verify_attention",
    "verify_attention_reference",
    "verify_attention_triton",
]
