"""A growable key/value buffer shared by the cache layers: in-place appends, cheap crops."""

from __future__ import annotations

import torch

from ..errors import InvalidInputError


class KVBuffer:
    """Preallocated ``[batch, kv_heads, capacity, head_dim]`` key and value storage, doubled when it runs out.

    ``keys``/``values`` are views of the first ``length`` slots; appends write in place (no ``torch.cat`` copy).

    Example:
        >>> buf = KVBuffer(capacity=4)
        >>> k = torch.randn(1, 2, 3, 8)
        >>> keys, values = buf.append(k, k)
        >>> keys.shape
        torch.Size([1, 2, 3, 8])
    """

    def __init__(self, capacity: int = 0, align: int = 1, doubling: bool = True) -> None:
        self.capacity = capacity
        self.align = align  # storage sizes are multiples of it (whole chunks)
        self.doubling = doubling  # grow by doubling (amortized appends), or to exactly what is asked (bounded storage)
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor:
        return self._k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._v[:, :, : self.length]

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, q, D]`` states after the current end; returns the ``[B, H, length, D]`` views."""
        end = self.length + key_states.shape[-2]
        self.reserve(end, key_states)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        return self.keys, self.values

    def write(self, start: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Overwrite slots ``[start, start + q)`` and set the length to their end."""
        self.length = start
        self.append(key_states, value_states)

    def reserve(self, size: int, like: torch.Tensor) -> None:
        """Make room for ``size`` slots, keeping the stored ones."""
        if self._k is not None and size <= self._k.shape[-2]:
            return
        held = 0 if self._k is None else self._k.shape[-2]
        capacity = max(size, self.capacity, 2 * held if self.doubling else 0)
        capacity += -capacity % self.align
        shape = (*like.shape[:2], capacity, like.shape[-1])
        new_k, new_v = self._allocate(shape, like), self._allocate(shape, like)
        if self._k is not None:
            new_k[:, :, : self.length] = self._k[:, :, : self.length]
            new_v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = new_k, new_v

    def _allocate(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return like.new_empty(shape)

    @property
    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole ``[B, H, allocated, D]`` key and value storage, written or not."""
        return self._k, self._v

    def index_write(
        self, slots: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, q, D]`` states at ``slots`` (``[q]`` long); returns the whole storage. Device work only:
        ``length`` is not touched (see :meth:`advance`)."""
        self._k.index_copy_(2, slots, key_states)
        self._v.index_copy_(2, slots, value_states)
        return self._k, self._v

    def advance(self, count: int) -> None:
        """Count ``count`` more slots as stored (after :meth:`index_write` wrote them)."""
        if self._k is None or self.length + count > self._k.shape[-2]:
            raise self._overflow(self.length + count)
        self.length += count

    def _overflow(self, size: int) -> RuntimeError:
        return RuntimeError(f"{size} slots written at fixed addresses overflow a KV buffer's storage (a bug).")

    # What readers of a full-cache layer call: views here, copies in :class:`~hf_triforce.caches.offload.HostKVBuffer`.

    def like(self) -> torch.Tensor:
        """``[B, H, 0, D]``: the storage's device, dtype and shape (to allocate summaries and views like it)."""
        return self._k[:, :, :0]

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots ``start .. end`` (views)."""
        return self._k[:, :, start:end], self._v[:, :, start:end]

    def read_keys(self, start: int, end: int) -> torch.Tensor:
        """Keys of slots ``start .. end`` (a view)."""
        return self._k[:, :, start:end]

    def gather_chunk_keys(self, chunks: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys a scoring of ``chunks`` ``[B, H, F]`` reads and the chunk ids there: the stored keys, ``chunks``."""
        return self.keys, chunks

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the batch rows at ``rows`` (``[B']`` indices) remain (a copy)."""
        if self._k is not None:
            self._k, self._v = self._k[rows], self._v[rows]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``|tokens_to_remove|`` slots (transformers' negative ``crop`` convention)."""
        if tokens_to_remove > 0:
            raise InvalidInputError(f"crop expects a negative count (tokens to remove), got {tokens_to_remove}.")
        self.length = max(0, self.length + tokens_to_remove)

    def drop_front(self, count: int) -> None:
        """Drop the first ``count`` stored slots, moving the others to the front (a sliding layer's trim).

        Example:
            >>> buf = KVBuffer(); _ = buf.append(torch.arange(4.0).view(1, 1, 4, 1), torch.zeros(1, 1, 4, 1))
            >>> buf.drop_front(3); buf.keys.flatten().tolist()
            [3.0]
        """
        if count <= 0:
            return
        kept = self.length - count
        self._k[:, :, :kept] = self._k[:, :, count : self.length].clone()
        self._v[:, :, :kept] = self._v[:, :, count : self.length].clone()
        self.length = kept

    def pack(self, slots: torch.Tensor) -> None:
        """Row ``b`` keeps its slots at ``slots[b]`` (``[B, k]``, in that order), moved to the front (length ``k``).

        Example:
            >>> buf = KVBuffer(); _ = buf.append(torch.arange(6.0).view(2, 1, 3, 1), torch.zeros(2, 1, 3, 1))
            >>> buf.pack(torch.tensor([[0, 2], [1, 2]])); buf.keys.flatten().tolist()
            [0.0, 2.0, 4.0, 5.0]
        """
        index = slots.to(self._k.device)[:, None, :, None].expand(-1, self._k.shape[1], -1, self._k.shape[-1])
        keys, values = self.keys.gather(2, index), self.values.gather(2, index)
        self.write(0, keys, values)

    def nbytes(self) -> int:
        """Bytes held by the allocated storage (both keys and values)."""
        if self._k is None:
            return 0
        return self._k.numel() * self._k.element_size() * 2
