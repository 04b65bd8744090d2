"""Which causal-mask function an attention implementation uses (``transformers.masking_utils``)."""

from __future__ import annotations

from typing import Literal

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

MaskKind = Literal["bool", "additive"]


def has_mask_function(implementation: str) -> bool:
    """Whether transformers builds a causal mask for ``attn_implementation=implementation``.

    Example:
        >>> has_mask_function("sdpa"), has_mask_function("nonexistent")
        (True, False)
    """
    return implementation in ALL_MASK_ATTENTION_FUNCTIONS


def mask_kind(model: torch.nn.Module) -> MaskKind | None:
    """``"bool"`` (sdpa), ``"additive"`` (eager) or ``None`` (a mask hf_triforce cannot build)."""
    implementation = model.config._attn_implementation
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        return None
    function = ALL_MASK_ATTENTION_FUNCTIONS[implementation]
    return {sdpa_mask: "bool", eager_mask: "additive"}.get(function)
