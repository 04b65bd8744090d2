"""A StreamingLLM view of the target's full KV cache: attention sinks + the most recent window.

The baseline that retrieval is compared with: the same token budget, spent on the first ``sinks``
tokens and the ``budget - sinks`` most recent ones (Xiao et al. 2024). The view is a set of token
indices into the full cache, gathered like a retrieval selection, so both views go through exactly the
same forward and differ only in which tokens they keep. Keys keep their true (post-RoPE) positions:
StreamingLLM proper re-rotates keys to contiguous cache slots so that a model never sees positions
beyond its training length, which a target reading its own context does not need (the package's
:class:`~hf_triforce.caches.StreamingLLMCache`, used by the level-0 draft model, does re-rotate).

Example:
    >>> streaming_indices(length=20, budget=8, sinks=2, kv_heads=1)[0, 0].tolist()
    [0, 1, 14, 15, 16, 17, 18, 19]
"""

from __future__ import annotations

import torch


def streaming_indices(length: int, budget: int, sinks: int, kv_heads: int, device=None) -> torch.Tensor:
    """``[1, kv_heads, S]`` token indices of the StreamingLLM view of a ``length``-token cache.

    ``S = min(length, budget)``: the first ``sinks`` tokens and the most recent ``budget - sinks`` (all
    tokens when they fit).

    Args:
        length: tokens in the full cache.
        budget: tokens in the view.
        sinks: attention-sink tokens kept at the start (``0 <= sinks < budget``).
        kv_heads: key/value heads (every head keeps the same tokens).
        device: device of the result.

    Raises:
        ValueError: ``sinks`` outside ``[0, budget)``.

    Example:
        >>> streaming_indices(5, 8, 2, 2).shape
        torch.Size([1, 2, 5])
    """
    if not 0 <= sinks < budget:
        raise ValueError(f"a StreamingLLM view needs 0 <= sinks < budget, got sinks={sinks}, budget={budget}.")
    if length <= budget:
        idx = torch.arange(length, device=device)
    else:
        window = budget - sinks
        idx = torch.cat([torch.arange(sinks, device=device), torch.arange(length - window, length, device=device)])
    return idx.expand(1, kv_heads, idx.shape[0])
