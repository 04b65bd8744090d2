"""``StreamingLLMCache``: attention sinks + a recent window, for the level-0 draft model."""

from __future__ import annotations

import torch

from ..errors import TriForceConfigError
from ..hf.model import apply_rope
from .base import BufferedCache, BufferedLayer
from .buffers import KVBuffer


def rotate_keys(keys: torch.Tensor, inv_freq: torch.Tensor, shift: int, interleaved: bool = False) -> torch.Tensor:
    """Move RoPE-rotated keys ``[B, H, S, D]`` by ``shift``: the result equals the keys rotated at ``p + shift``.

    The first ``2 * len(inv_freq)`` channels are rotated (fewer than ``D`` with partial rotary), paired as Llama's
    ``rotate_half`` pairs them or, with ``interleaved``, as Cohere's and GLM's
    (:func:`~hf_triforce.hf.model.apply_rope`).

    Example:
        >>> k = torch.randn(1, 1, 3, 8); f = 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8)
        >>> torch.allclose(rotate_keys(rotate_keys(k, f, 5), f, -5), k, atol=1e-5)
        True
    """
    angles = (shift * inv_freq.double()).to(torch.float32)
    pair = (lambda a: a.repeat_interleave(2)) if interleaved else (lambda a: torch.cat([a, a]))
    return apply_rope(keys, pair(angles.cos()).to(keys.dtype), pair(angles.sin()).to(keys.dtype), interleaved)


class StreamingLayer(BufferedLayer):
    """One layer: ``sinks`` first tokens, then a window of the most recent ones, at contiguous slots."""

    def __init__(self, budget: int, sinks: int, inv_freq: torch.Tensor, interleaved: bool = False) -> None:
        super().__init__(KVBuffer(budget))
        self.budget, self.sinks, self.inv_freq, self.interleaved = budget, sinks, inv_freq, interleaved

    def get_max_length(self) -> int:
        return self.budget

    def evict(self, count: int) -> None:
        """Drop the ``count`` oldest window tokens; the rest move down ``count`` slots (keys re-rotated)."""
        start, length = self.sinks, self.buffer.length
        if count <= 0 or length == 0:
            return
        moved = self.buffer.keys[:, :, start + count :]
        keys = rotate_keys(moved, self.inv_freq.to(moved.device), -count, self.interleaved)
        values = self.buffer.values[:, :, start + count :].clone()
        self.buffer.write(start, keys, values)


class StreamingLLMCache(BufferedCache):
    """StreamingLLM KV cache (Xiao et al. 2024): ``sinks`` first tokens plus the most recent window, ``budget`` in all.

    The token in slot ``i`` is rotated at position ``i``, so a small draft model never sees positions beyond ``budget``.
    :meth:`make_room` before a forward evicts the oldest window tokens (``evict_batch`` more, to amortize re-rotating
    the keys that move down); a negative :meth:`crop` rolls back. ``inv_freq``: ``[R]`` rotary inverse frequencies, or
    one per layer (a rotary base per layer kind); ``interleaved``: pairs ``(2i, 2i + 1)``, not ``(i, i + R)``.

    Example:
        >>> f = 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8)
        >>> cache = StreamingLLMCache(num_layers=1, budget=6, sinks=2, inv_freq=f, evict_batch=0)
        >>> _ = cache.update(torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8), layer_idx=0)
        >>> cache.make_room(1), cache.get_seq_length()
        (1, 5)
    """

    def __init__(
        self,
        num_layers: int,
        budget: int,
        sinks: int,
        inv_freq: torch.Tensor | list[torch.Tensor],
        evict_batch: int = 16,
        interleaved: bool = False,
    ):
        if budget <= sinks:
            raise TriForceConfigError(f"StreamingLLMCache budget ({budget}) must exceed sinks ({sinks}).")
        freqs = inv_freq if isinstance(inv_freq, list | tuple) else [inv_freq] * num_layers
        if len(freqs) != num_layers:
            raise TriForceConfigError(f"StreamingLLMCache got {len(freqs)} inv_freq tensors for {num_layers} layers.")
        super().__init__(layers=[StreamingLayer(budget, sinks, freq, interleaved) for freq in freqs])
        self.budget, self.sinks = budget, sinks
        self.evict_batch = evict_batch

    def make_room(self, query_length: int) -> int:
        """Evict enough old window tokens for ``query_length`` new ones; returns how many were evicted."""
        length = self.get_seq_length()
        overflow = length + query_length - self.budget
        if overflow <= 0:
            return 0
        count = min(length - self.sinks, overflow + self.evict_batch)
        if count < overflow:
            raise TriForceConfigError(
                f"A forward of {query_length} tokens does not fit a StreamingLLM cache of budget {self.budget} "
                f"with {self.sinks} sinks; raise draft_cache_budget."
            )
        for layer in self.layers:
            layer.evict(count)
        return count
