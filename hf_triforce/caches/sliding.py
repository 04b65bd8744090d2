"""``SlidingLayer``: a sliding-window layer of the full cache, holding its window and at most one round more.

A layer that attends through a sliding ``window`` never reads a key ``window`` or more positions behind its query, so
it keeps, as transformers' ``DynamicSlidingWindowLayer`` does, the last ``window - 1`` tokens (slot 0 holds position
:attr:`SlidingLayer.start`). Outside a TriForce round an ``update`` returns the held tokens and the new ones, and keeps
only the last ``window - 1`` (a prefill, or a later plain ``generate()`` over a returned cache). Within a call's rounds
(:meth:`SlidingLayer.activate_past_recording`) a round's tokens are all kept until the verification's ``crop`` removed
the rejected ones; the call then :meth:`~SlidingLayer.trim`\\ s the layer back to what the next query's window reaches.
Every reader goes through the layer's own positions (``get_seq_length`` is the absolute length, ``get_mask_sizes``
the held length and its offset, as ``DynamicSlidingWindowLayer`` answers them).
"""

from __future__ import annotations

import torch

from ..errors import InternalError, InvalidInputError
from .base import BufferedLayer
from .buffers import KVBuffer


class SlidingLayer(BufferedLayer):
    """One sliding-window layer of a :class:`~hf_triforce.caches.retrieval.RetrievalCache`.

    ``round_slots``: slots reserved beyond ``window - 1`` for one round's tokens (the storage never doubles).

    Example:
        >>> layer = SlidingLayer(window=4, round_slots=2)
        >>> keys, _ = layer.update(torch.randn(1, 1, 6, 2), torch.randn(1, 1, 6, 2))  # a prefill: all 6 returned
        >>> keys.shape[2], layer.start, layer.get_seq_length(), layer.get_mask_sizes(1)
        (6, 3, 6, (4, 3))
        >>> layer.activate_past_recording(); _ = layer.update(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2))
        >>> layer.crop(-1); layer.trim(layer.get_seq_length() - 3)  # one token rejected, then back to the window
        >>> layer.start, layer.buffer.length, layer.buffer.nbytes() // 16  # 5 slots allocated: window - 1 + 2
        (4, 3, 5)
    """

    is_sliding = True

    def __init__(self, window: int, round_slots: int = 0) -> None:
        super().__init__(KVBuffer(window - 1 + round_slots, doubling=False))
        self.window = window
        self.start = 0  # the position of slot 0
        self.record_past = False

    def activate_past_recording(self, **kwargs) -> None:
        """Keep every token an ``update`` brings until :meth:`trim` (a round can then be cropped)."""
        self.record_past = True

    def stop_recording(self) -> None:
        """``update`` keeps only the last ``window - 1`` tokens again (the call is over)."""
        self.record_past = False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keep = self.window - 1
        if self.record_past or self.buffer.length + key_states.shape[-2] <= keep:
            self.keys, self.values = self.buffer.append(key_states, value_states)
            return self.keys, self.values
        if self.buffer.length:  # what this forward attends to: the held tokens, then the new ones
            keys = torch.cat([self.buffer.keys, key_states], dim=-2)
            values = torch.cat([self.buffer.values, value_states], dim=-2)
        else:
            keys, values = key_states, value_states
        self.start += keys.shape[-2] - keep
        self.buffer.write(0, keys[:, :, -keep:], values[:, :, -keep:])
        self.keys, self.values = self.buffer.keys, self.buffer.values
        return keys, values

    def load(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int) -> None:
        """Start from the last ``key_states.shape[2]`` tokens of a sequence of ``length`` (a caller's cache)."""
        if self.buffer.length:
            raise InternalError("a sliding layer is loaded only while empty")
        self.start = length - key_states.shape[-2]
        self.update(key_states, value_states)

    def trim(self, keep_from: int) -> None:
        """Drop the slots before position ``keep_from`` (after a verification's crop: no query reaches them)."""
        self.buffer.drop_front(min(keep_from - self.start, self.buffer.length))
        self.start = max(self.start, keep_from)
        if self.keys is not None:
            self.keys, self.values = self.buffer.keys, self.buffer.values

    def recent_indices(self, budget: int) -> torch.Tensor:
        """``[B, H_kv, S]`` absolute positions of the last ``S = min(held, budget)`` tokens: a level-1 view's share of
        this layer (its window, needing no chunk summaries and no retrieval)."""
        end = self.get_seq_length()
        like = self.buffer.like()
        first = max(self.start, end - budget)
        return torch.arange(first, end, device=like.device).expand(*like.shape[:2], end - first)

    def local(self, positions: torch.Tensor) -> torch.Tensor:
        """Slots of the tokens at absolute ``positions``."""
        return positions - self.start

    def read_from(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the tokens from absolute ``position`` on (held: see :meth:`holds`)."""
        return self.buffer.read(position - self.start, self.buffer.length)

    def holds(self, position: int) -> bool:
        """Whether the token at absolute ``position`` (or the end) is still held."""
        return position >= self.start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffer.length + query_length, self.start

    def get_seq_length(self) -> int:
        return self.start + self.buffer.length

    def get_max_length(self) -> int:
        return self.window

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise InvalidInputError(f"crop expects a negative count (tokens to remove), got {tokens_to_remove}.")
        if -tokens_to_remove > self.buffer.length:
            raise InternalError("a sliding layer was cropped past the tokens it holds (trimmed before the crop)")
        super().crop(tokens_to_remove)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the batch rows at ``rows`` remain."""
        self.buffer.keep_rows(rows)
        if self.keys is not None:
            self.keys, self.values = self.buffer.keys, self.buffer.values

    def reset(self) -> None:
        self.buffer.length, self.start = 0, 0
