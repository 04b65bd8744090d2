"""Fast paths, each beside the pure-torch (or transformers) computation it must equal."""

from .attention import gqa_sdpa_attention
from .retrieval import chunk_scores, gather_kv_into, gather_kv_triton, score_chunks_triton, triton_enabled
from .verification import verify_attention, verify_attention_reference, verify_attention_triton

__all__ = [
    "chunk_scores",
    "gather_kv_into",
    "gather_kv_triton",
    "gqa_sdpa_attention",
    "score_chunks_triton",
    "triton_enabled",
    "verify_attention",
    "verify_attention_reference",
    "verify_attention_triton",
]
