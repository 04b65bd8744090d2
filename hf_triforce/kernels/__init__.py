"""Fast paths, each beside the pure-torch (or transformers) computation it must equal."""

from .attention import gqa_sdpa_attention

__all__ = ["gqa_sdpa_attention"]
