"""Fixed-capacity layers for the level-0 :class:`StreamingLLMCache`, for static-shape (CUDA graph) draft steps.

Eviction and crops are in-place writes between steps; a token's position is its slot (so are ``position_ids``).
"""

from __future__ import annotations

import torch

from ..errors import InvalidInputError
from .static_buffer import SlotWrites, StaticKVBuffer, StepSlots
from .streaming import StreamingLayer, StreamingLLMCache


class StaticStreamingLayer(SlotWrites, StreamingLayer):
    """A StreamingLLM layer over ``budget`` fixed slots (sinks, then the recent window)."""

    def __init__(
        self, budget: int, sinks: int, inv_freq: torch.Tensor, slots: StepSlots, interleaved: bool = False
    ) -> None:
        super().__init__(budget, sinks, inv_freq, interleaved)
        self.buffer = StaticKVBuffer(budget)
        self.slots = slots


def use_static_layers(cache: StreamingLLMCache) -> StepSlots:
    """Swap an empty ``cache``'s layers for :class:`StaticStreamingLayer` in place; returns their shared slots.

    Example:
        >>> f = 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8)
        >>> cache = StreamingLLMCache(num_layers=2, budget=8, sinks=2, inv_freq=f)
        >>> slots = use_static_layers(cache)
        >>> type(cache.layers[1]).__name__, cache.layers[1].slots is slots
        ('StaticStreamingLayer', True)
    """
    if cache.get_seq_length() > 0:
        raise InvalidInputError("use_static_layers needs an empty StreamingLLMCache.")
    slots = StepSlots()
    cache.layers = [
        StaticStreamingLayer(cache.budget, cache.sinks, layer.inv_freq, slots, layer.interleaved)
        for layer in cache.layers
    ]
    return slots
