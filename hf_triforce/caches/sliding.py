"""``SlidingLayer``: a sliding-window layer of the full cache, holding its window and at most one round more.

A layer that attends through a sliding ``window`` never reads a key ``window`` or more positions behind its query, so
it keeps, as transformers' ``DynamicSlidingWindowLayer`` does, the last ``window - 1`` tokens (slot 0 holds position
:attr:`SlidingLayer.start`). Outside a TriForce round an ``update`` returns the held tokens and the new ones, and keeps
only the last ``window - 1`` (a prefill, or a later plain ``generate()`` over a returned cache). Within a call's rounds
(:meth:`SlidingLayer.activate_past_recording`) a round's tokens are all kept until the verification's ``crop`` removed
the rejected ones; the call then :meth:`~SlidingLayer.trim`\\ s the layer back to what the next query's window reaches.
Every reader goes through the layer's own positions (``get_seq_length`` is the absolute length, ``get_mask_sizes``
the held length and its offset, as ``DynamicSlidingWindowLayer`` answers them).

In a batch, rows accept different numbers of drafts, so a round leaves holes (:mod:`~hf_triforce.caches.slots`); a
sliding layer does not keep them: after each round (:meth:`SlidingLayer.pack_rows`) each row's last ``window - 1``
tokens are packed to the end of the layer (earlier slots of a shorter row are masked, like left padding). Its slots
then have their own validity and sliding-window indices (:meth:`~SlidingLayer.validity`, :meth:`~SlidingLayer.index`)
instead of the batch's shared ones, so it holds at most ``window - 1`` slots and one round, whatever the acceptance.
"""

from __future__ import annotations

import torch

from ..errors import InternalError
from .base import BufferedLayer
from .buffers import KVBuffer
from .slots import SlotMask


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
        self.record_past = False
        self.packed: torch.Tensor | None = None  # a batch: [B, P] validity of the first P slots (pack_rows)
        self.packed_counted: torch.Tensor | None = None  # [B, P] which of them a sliding window counts

    def activate_past_recording(self, **kwargs) -> None:
        """Keep every token an ``update`` brings until :meth:`trim` (a round can then be cropped)."""
        self.record_past = True

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

    def pack_rows(self, slots: SlotMask) -> None:
        """A batch's trim: each row keeps the last ``window - 1`` slots its window counts (its tokens, and a prompt's
        padding, :meth:`~hf_triforce.caches.slots.SlotMask.counted`; not the holes), packed to the end of the first
        ``k`` slots (``k``: the most any row keeps); ``slots``: the batch's, after the round's crop.

        Example:
            >>> layer = SlidingLayer(window=3, round_slots=2); slots = SlotMask(torch.ones(2, 2, dtype=torch.bool))
            >>> _ = layer.update(torch.arange(4.0).view(2, 1, 2, 1), torch.zeros(2, 1, 2, 1))
            >>> layer.activate_past_recording(); _ = slots.append(2)
            >>> _ = layer.update(torch.arange(4.0, 8).view(2, 1, 2, 1), torch.zeros(2, 1, 2, 1))
            >>> slots.keep(torch.tensor([1, 2]), width=2); layer.pack_rows(slots)  # row 0 keeps one: a hole, packed
            0
            >>> layer.buffer.keys.flatten().tolist(), layer.packed.int().tolist()
            ([1.0, 4.0, 6.0, 7.0], [[1, 1], [1, 1]])
        """
        valid, counted = self.validity(slots), self._with_packed(slots.counted(), self.packed_counted)
        held = valid.shape[1]
        keep = counted.sum(dim=1).clamp(max=self.window - 1)  # [B]
        k = int(keep.max())
        trailing = counted.flip(1).int().cumprod(dim=1).sum(dim=1)  # [B] counted slots at the end, before any hole
        if bool((trailing >= keep).all()):  # already packed: drop the front
            self.buffer.drop_front(held - k)
            self.packed = valid[:, held - k :]
        else:
            order = torch.sort(counted.to(torch.uint8), dim=1, stable=True).indices[:, held - k :]  # holes first
            self.buffer.pack(order)
            self.packed = valid.gather(1, order)
        self.packed_counted = torch.arange(k, device=valid.device)[None] >= (k - keep)[:, None]
        self.packed &= self.packed_counted
        self.start = slots.length - k
        if self.keys is not None:
            self.keys, self.values = self.buffer.keys, self.buffer.values

    def validity(self, slots: SlotMask) -> torch.Tensor:
        """``[B, held]`` whether each held slot is a real token of its row: the packed slots', then those since
        (the batch's last slots)."""
        return self._with_packed(slots.valid, self.packed)

    def _with_packed(self, per_slot: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
        """``packed`` ``[B, P]`` for the packed slots, then ``per_slot``'s (``[B, L]``, the batch's) for those since."""
        width = 0 if packed is None else packed.shape[1]
        since = per_slot[:, per_slot.shape[1] - (self.buffer.length - width) :]
        return since if packed is None else torch.cat([packed, since], dim=1)

    def index(self, slots: SlotMask) -> torch.Tensor:
        """``[B, held]`` each held slot's index as plain ``generate()`` lays the row out (what its window counts,
        :meth:`~hf_triforce.caches.slots.SlotMask.plain_index`): a packed row's counted slots are consecutive."""
        index = slots.plain_index()
        first = slots.length - (self.buffer.length - (0 if self.packed is None else self.packed.shape[1]))
        if self.packed is None:
            return index[:, first:]
        packed = self.packed.shape[1]
        before = index[:, first - 1 : first] if first else index[:, :1] - 1  # the last slot packed
        return torch.cat([before - packed + 1 + torch.arange(packed, device=index.device), index[:, first:]], dim=1)

    def recent_indices(self, budget: int) -> torch.Tensor:
        """``[B, H_kv, S]`` absolute positions of the last ``S = min(held, budget)`` tokens: a level-1 view's share of
        this layer (its window, needing no chunk summaries and no retrieval)."""
        end = self.get_seq_length()
        like = self.buffer.like()
        first = max(self.start, end - budget)
        return torch.arange(first, end, device=like.device).expand(*like.shape[:2], end - first)

    def get_seq_length(self) -> int:
        return self.start + self.buffer.length

    def get_max_length(self) -> int:
        return self.window

    def crop(self, tokens_to_remove: int) -> None:
        if -tokens_to_remove > self.buffer.length:
            raise InternalError("a sliding layer was cropped past the tokens it holds (trimmed before the crop)")
        super().crop(tokens_to_remove)

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows)
        if self.packed is not None:
            self.packed, self.packed_counted = self.packed[rows], self.packed_counted[rows]

    def reset(self) -> None:
        self.buffer.length, self.start, self.packed, self.packed_counted = 0, 0, None, None
