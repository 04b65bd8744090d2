"""The full cache's keys and values in host memory, read on the model's device only through explicit copies.

``TriForceConfig(offload_kv=True)``: only level 2 reads the full cache whole, so it lives in host memory (pinned with
CUDA); a forward streams each layer into one of two device buffers (:class:`DeviceWindow`). Every read is an explicit
copy counted in :class:`Transfers`, so a stray host read fails on the CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.retrieval import gather_chunks, gather_tokens
from .buffers import KVBuffer


@dataclass
class Transfers:
    """Bytes copied between host and device by an offloaded cache (keys and values together)."""

    to_device: int = 0
    to_host: int = 0

    def count(self, tensors: tuple[torch.Tensor, ...], to_device: bool) -> None:
        n = sum(t.numel() * t.element_size() for t in tensors)
        if to_device:
            self.to_device += n
        else:
            self.to_host += n


class DeviceWindow:
    """Two layers' worth of device storage (whole layers) that an offloaded cache's forwards attend to, one at a time.

    :meth:`fetch` loads layer ``i`` into buffer ``i % 2`` and starts copying layer ``i + 1`` into the other (on CUDA on
    a side stream, overlapping layer ``i``'s compute).
    """

    def __init__(self, layers: list[HostKVBuffer], device: torch.device) -> None:
        self.layers, self.device = layers, device
        self.buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None, None]
        self.loaded: list[tuple[int, int] | None] = [None, None]  # (layer, valid slots) held by each buffer
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.ready: list[torch.cuda.Event | None] = [None, None]

    def fetch(self, layer: int, prefetch: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s ``[B, H, capacity, D]`` device buffers, its cached slots ``0 .. length`` current;
        ``prefetch``: start copying the next layer (not when nothing is cached yet: a prefill's first forward)."""
        slot = layer % 2
        self._load(layer, slot, on_side=False)
        self._wait(slot)
        if prefetch:
            self._load((layer + 1) % len(self.layers), 1 - slot, on_side=True)
        return self.buffers[slot]

    def wrote(self, layer: int, end: int) -> None:
        """Layer ``layer``'s device buffer now holds its slots ``0 .. end``."""
        self.loaded[layer % 2] = (layer, end)

    def _wait(self, slot: int) -> None:
        """The current stream waits for a copy into buffer ``slot`` still running on the side stream."""
        if self.ready[slot] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
            self.ready[slot] = None

    def _load(self, layer: int, slot: int, on_side: bool) -> None:
        source = self.layers[layer]
        if self.buffers[slot] is None or self.buffers[slot][0].shape[2] < source.capacity_now:  # the whole storage
            self.buffers[slot], self.loaded[slot] = source.new_device_storage(), None
        held = self.loaded[slot]
        if source.length == 0 or (held is not None and held[0] == layer and held[1] >= source.length):
            return
        if on_side and self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                source.copy_into(self.buffers[slot])
                self.ready[slot] = torch.cuda.Event()
                self.ready[slot].record(self.stream)
        else:
            source.copy_into(self.buffers[slot])
        self.loaded[slot] = (layer, source.length)


class HostKVBuffer(KVBuffer):
    """A :class:`~hf_triforce.caches.buffers.KVBuffer` in host memory: one offloaded layer of the full cache.

    Appending writes back to the host and returns the layer's device buffer from :class:`DeviceWindow`; every other
    read is an explicit, counted copy. ``index``: the layer's buffer in the window.

    Example:
        >>> transfers = Transfers()
        >>> layers = [HostKVBuffer(8, 1, 0, torch.device("cpu"), transfers)]
        >>> layers[0].window = DeviceWindow(layers, torch.device("cpu"))
        >>> k = torch.randn(1, 2, 3, 4)
        >>> keys, _ = layers[0].append(k, k)
        >>> keys.shape, transfers.to_host  # the new keys and values went to the host
        (torch.Size([1, 2, 3, 4]), 192)
    """

    def __init__(self, capacity: int, align: int, index: int, device: torch.device, transfers: Transfers) -> None:
        super().__init__(capacity, align)
        self.index, self.device, self.transfers = index, device, transfers
        self.window: DeviceWindow | None = None
        self._proto: torch.Tensor | None = None  # an empty device tensor of the layer's dtype and [B, H, 0, D] shape

    def _no_host_tensors(self) -> torch.Tensor:
        raise AttributeError("an offloaded cache layer hands out no host tensors: read it through read() or gather()")

    keys = values = property(_no_host_tensors)

    @property
    def capacity_now(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def like(self) -> torch.Tensor:
        """``[B, H, 0, D]`` on the device, of the layer's dtype."""
        return self._proto

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, q, D]`` states to the host and the device buffer; returns the device ``[B, H, length, D]``."""
        start, end = self.length, self.length + key_states.shape[-2]
        if self._proto is None:
            self._proto = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self.reserve(end, key_states)
        keys, values = self.window.fetch(self.index, prefetch=start > 0)
        keys[:, :, start:end], values[:, :, start:end] = key_states, value_states
        self._k[:, :, start:end].copy_(key_states, non_blocking=True)
        self._v[:, :, start:end].copy_(value_states, non_blocking=True)
        self.transfers.count((key_states, value_states), to_device=False)
        self.length = end
        self.window.wrote(self.index, end)
        return keys[:, :, :end], values[:, :, :end]

    def _allocate(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """Host storage, pinned on a machine with CUDA."""
        return torch.empty(shape, dtype=like.dtype, device="cpu", pin_memory=torch.cuda.is_available())

    def new_device_storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Device buffers for this layer's whole host storage."""
        return self._proto.new_empty(self._k.shape), self._proto.new_empty(self._k.shape)

    def copy_into(self, storage: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Copy the cached slots into device ``storage`` (counted)."""
        keys, values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        storage[0][:, :, : self.length].copy_(keys, non_blocking=True)
        storage[1][:, :, : self.length].copy_(values, non_blocking=True)
        self.transfers.count((keys, values), to_device=True)

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of slots ``start .. end``."""
        return self._to_device(self._k[:, :, start:end], self._v[:, :, start:end])

    def read_keys(self, start: int, end: int) -> torch.Tensor:
        """A device copy of the keys of slots ``start .. end``."""
        return self._to_device(self._k[:, :, start:end])[0]

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of the keys and values at per-head token ``indices`` ``[B, H, S]``."""
        host = indices.cpu()
        keys, values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        return self._to_device(gather_tokens(keys, host), gather_tokens(values, host))

    def gather_chunk_keys(self, chunks: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys of ``chunks`` ``[B, H, F]`` on the device, ``[B, H, F * chunk_size, D]``, and their ids there."""
        keys = self._to_device(gather_chunks(self._k[:, :, : self.length], chunks.cpu(), chunk_size))[0]
        ids = torch.arange(chunks.shape[-1], device=chunks.device).expand_as(chunks)
        return keys, ids

    def _to_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.transfers.count(tensors, to_device=True)
        return tuple(t.to(self.device, non_blocking=True) if t.device != self.device else t.clone() for t in tensors)

    def keep_rows(self, rows: torch.Tensor) -> None:
        super().keep_rows(rows.cpu())
        if self._proto is not None:
            self._proto = self._proto[rows]
        for slot in (0, 1):  # a copy still running on the side stream must land before its buffer is freed
            self.window._wait(slot)
        self.window.buffers, self.window.loaded = [None, None], [None, None]
