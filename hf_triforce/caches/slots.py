"""Per-row slot validity for batched caches: left padding and the holes ragged acceptance leaves.

Storage is rectangular, so a round keeps, in every row, as many new slots as the row that accepted most; a row that
accepted fewer gets *holes*: kept in storage, never attended to, like padding. Each row keeps every token it accepted.
"""

from __future__ import annotations

import torch


def keep_leading(valid: torch.Tensor, kept: torch.Tensor, width: int) -> tuple[torch.Tensor, int]:
    """Of the last ``width`` columns of ``valid`` ``[B, T]``, row ``b`` keeps its first ``kept[b]``; columns no row
    keeps are dropped. Returns the new validity and the (non-positive) count dropped, for a cache's ``crop``.

    Example:
        >>> valid, crop = keep_leading(torch.ones(2, 4, dtype=torch.bool), torch.tensor([1, 2]), width=3)
        >>> valid.int().tolist(), crop
        ([[1, 1, 0], [1, 1, 1]], -1)
    """
    widest = int(kept.max()) if kept.numel() else 0
    new = torch.arange(widest, device=valid.device)[None] < kept[:, None].to(valid.device)
    return torch.cat([valid[:, : valid.shape[1] - width], new], dim=1), -(width - widest)


def gathered_validity(valid: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, S]``: whether the slots gathered at ``indices`` ``[B, H_kv, S]`` are real, by ``valid`` ``[B, L]``.

    Example:
        >>> gathered_validity(torch.tensor([[False, True, True]]), torch.tensor([[[0, 2], [1, 2]]])).tolist()
        [[[False, True], [True, True]]]
    """
    return valid[:, None].expand(-1, indices.shape[1], -1).gather(-1, indices)


class SlotMask:
    """Which of a batched cache's ``L`` slots hold real tokens, per row, and each row's next position.

    ``valid``: ``[B, L]`` bool (the prompt's attention mask: padding anywhere but after a row's last token).

    Example:
        >>> slots = SlotMask(torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool))
        >>> slots.positions.tolist(), slots.append(2).tolist()
        ([2, 3], [[2, 3], [3, 4]])
        >>> slots.keep(torch.tensor([1, 2]), width=2)  # both slots kept by row 1: nothing to crop
        0
        >>> slots.valid.int().tolist(), slots.positions.tolist()
        ([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]], [3, 5])
    """

    def __init__(self, valid: torch.Tensor) -> None:
        self.valid = valid.bool()
        self.positions = self.valid.sum(dim=1)
        self.prompt_length = self.valid.shape[1]

    def counted(self) -> torch.Tensor:
        """``[B, L]`` the slots plain ``generate()`` lays a row out in (what sliding windows count): the prompt's
        slots, padding included, then the new tokens, not the holes."""
        counted = self.valid.clone()
        counted[:, : self.prompt_length] = True
        return counted

    def plain_index(self) -> torch.Tensor:
        """``[B, L]`` each slot's index as plain ``generate()`` lays the row out (:meth:`counted`); a hole repeats
        its left neighbour's index."""
        return self.counted().long().cumsum(-1) - 1

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def append(self, width: int) -> torch.Tensor:
        """Mark ``width`` new slots valid in every row; returns their positions ``[B, width]``."""
        ones = self.valid.new_ones(self.valid.shape[0], width)
        self.valid = torch.cat([self.valid, ones], dim=1)
        return self.positions[:, None] + torch.arange(width, device=self.valid.device)

    def keep(self, kept: torch.Tensor, width: int) -> int:
        """Of the last ``width`` slots, row ``b`` keeps its first ``kept[b]``; returns the crop count."""
        self.valid, crop = keep_leading(self.valid, kept, width)
        self.positions = self.positions + kept.to(self.positions.device)
        return crop

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the rows at ``rows`` (``[B']`` indices) remain."""
        self.valid, self.positions = self.valid[rows], self.positions[rows]

    def chunk_mask(self, chunk_size: int) -> torch.Tensor:
        """``[B, L // chunk_size]`` bool: complete chunks holding at least one real token."""
        n = self.length // chunk_size
        return self.valid[:, : n * chunk_size].view(-1, n, chunk_size).any(dim=-1)

    def first_chunk(self, chunk_size: int) -> torch.Tensor:
        """``[B]`` index of each row's first chunk holding a real token (its attention sink)."""
        return self.valid.int().argmax(dim=1) // chunk_size


class ViewSlots:
    """Slot validity of a batched retrieval view, per layer, row and KV head.

    Layer ``l`` holds ``S`` gathered tokens (validity ``gathered[l]`` ``[B, H_kv, S]``: they differ per head), then a
    tail shared by all heads and layers (the full cache's tokens since the selection, then drafts; ``tail`` ``[B, T]``).
    A sliding layer, copied again at each sync (its rows are packed), covers the tail's first ``covered[l]`` slots.

    Example:
        >>> view = ViewSlots([torch.ones(1, 2, 3, dtype=torch.bool)], torch.tensor([[True, False]]))
        >>> view.for_layer(0).shape
        torch.Size([1, 2, 5])
    """

    def __init__(self, gathered: list[torch.Tensor], tail: torch.Tensor) -> None:
        self.gathered, self.tail = gathered, tail.bool()
        self.covered = [0] * len(gathered)

    def in_window(self, layer_idx: int, window: int | None, q_len: int) -> None:
        """No window: a level-1 view is compacted, its sliding layers attend to all of it (level 1 only drafts)."""
        return None

    def for_layer(self, layer_idx: int) -> torch.Tensor:
        """``[B, H_kv, S + T]`` validity of layer ``layer_idx``'s keys."""
        gathered, tail = self.gathered[layer_idx], self.tail[:, self.covered[layer_idx] :]
        return torch.cat([gathered, tail[:, None].expand(-1, gathered.shape[1], -1)], dim=-1)

    def cover(self, layer_idx: int, valid: torch.Tensor, covered: int) -> None:
        """Layer ``layer_idx`` holds slots of validity ``valid`` ``[B, S']`` before the tail's ``covered``-th slot."""
        self.gathered[layer_idx] = valid[:, None].expand(-1, self.gathered[layer_idx].shape[1], -1)
        self.covered[layer_idx] = covered

    def append(self, width: int) -> None:
        """Mark ``width`` new tail slots valid in every row (a level-1 forward's inputs)."""
        self.tail = torch.cat([self.tail, self.tail.new_ones(self.tail.shape[0], width)], dim=1)

    def keep(self, kept: torch.Tensor, width: int) -> int:
        """Of the last ``width`` tail slots keep the first ``kept[b]`` of row ``b``; returns the crop count."""
        self.tail, crop = keep_leading(self.tail, kept, width)
        return crop


class CacheSlots:
    """The validity a full-cache forward attends with, ``[B, 1, held]`` per layer: the batch's slots for a full layer,
    a sliding layer's own (its rows packed, :meth:`~hf_triforce.caches.sliding.SlidingLayer.pack_rows`).

    Example:
        >>> from hf_triforce.caches.retrieval import RetrievalCache
        >>> CacheSlots(SlotMask(torch.ones(2, 3)), RetrievalCache(num_layers=1)).for_layer(0).shape
        torch.Size([2, 1, 3])
    """

    def __init__(self, slots: SlotMask, cache) -> None:
        self.slots, self.cache = slots, cache

    def for_layer(self, layer_idx: int) -> torch.Tensor:
        return self.cache.validity(layer_idx, self.slots)[:, None]

    def in_window(self, layer_idx: int, window: int | None, q_len: int) -> torch.Tensor | None:
        """``[B, 1, q, held]``: layer ``layer_idx``'s keys within the sliding ``window`` of its last ``q_len`` slots'
        queries, or ``None`` (``key > query - window`` by their index as plain ``generate()`` counts).

        Example:
            >>> from hf_triforce.caches.retrieval import RetrievalCache
            >>> slots = SlotMask(torch.tensor([[0, 1, 1, 1, 1]]))
            >>> CacheSlots(slots, RetrievalCache(num_layers=1)).in_window(0, 2, 1)[0, 0].int().tolist()
            [[0, 0, 0, 1, 1]]
        """
        if window is None:  # a full layer: no index needed
            return None
        index = self.cache.index(layer_idx, self.slots)
        if window >= index.shape[1]:  # every slot's index is within the held count
            return None
        return (index[:, None, :] > index[:, -q_len:, None] - window)[:, None]
