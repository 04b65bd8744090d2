"""Fast paths, each beside the pure-torch computation it must equal (:mod:`.dispatch`: when a Triton kernel runs)."""

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
    "chunk_means", "chunk_scores", "gather_kv_into", "gather_kv_triton", "gather_tokens", "gqa_sdpa_attention",
    "score_chunks", "score_chunks_triton", "triton_enabled", "verify_attention", "verify_attention_reference",
    "verify_attention_triton",
]  # fmt: skip
