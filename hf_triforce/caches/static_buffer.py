"""Fixed-capacity key/value storage written at slots given by a tensor: the cache side of a static-shape step.

A CUDA graph replays kernels on the memory addresses seen at capture, so a cache a graph writes to
must never reallocate and must take *where* to write from a device tensor, not from Python state.
:class:`StaticKVBuffer` allocates its ``[B, H, capacity, D]`` storage once (zero-filled) and writes a
step's states with ``index_copy_`` at the slots held by a shared :class:`StepSlots`; the layers built
on it (:class:`SlotWrites`) return the whole fixed-capacity storage from ``update`` and report the
capacity from ``get_mask_sizes``, like transformers' ``StaticLayer``. The host-side ``length`` (the
visible slots) is bookkeeping the step runner advances *after* a step: ``update`` itself changes no
Python state, so an eager step and a graph replay have the same effect.
"""

from __future__ import annotations

import torch

from .buffers import KVBuffer


class StepSlots:
    """The cache slots ``[q]`` (long, on the model's device) the current step writes; shared by all layers.

    The step runner points ``positions`` at its static per-width slot tensor before a forward (or a capture).
    """

    def __init__(self) -> None:
        self.positions: torch.Tensor | None = None


class StaticKVBuffer(KVBuffer):
    """A :class:`KVBuffer` whose storage is allocated once, zero-filled, and never reallocated.

    Unwritten slots hold zeros, not uninitialized memory: a masked slot gets attention weight 0, and
    ``0 * NaN`` from garbage would still poison the output. Host-driven writes (``append``/``write``,
    used to gather a selection or evict) and device-driven ones (:meth:`index_write`) share the storage.

    Example:
        >>> buf = StaticKVBuffer(capacity=6)
        >>> k = torch.randn(1, 2, 2, 8)
        >>> keys, _ = buf.index_write(torch.tensor([3, 4]), k, k)
        >>> keys.shape, bool((keys[:, :, 3:5] == k).all()), buf.length
        (torch.Size([1, 2, 6, 8]), True, 0)
    """

    def reserve(self, size: int, like: torch.Tensor) -> None:
        """Allocate the ``capacity`` slots on first use; raise if ``size`` exceeds them."""
        if size > self.capacity:
            raise self._overflow(size)
        if self._k is None:
            shape = (*like.shape[:2], self.capacity, like.shape[-1])
            self._k, self._v = like.new_zeros(shape), like.new_zeros(shape)

    def index_write(
        self, slots: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, q, D]`` states at ``slots`` (``[q]`` long tensor), allocating the storage on first use;
        returns the full storage (see :meth:`KVBuffer.index_write`)."""
        self.reserve(self.capacity, key_states)
        return super().index_write(slots, key_states, value_states)

    def _overflow(self, size: int) -> RuntimeError:
        return RuntimeError(
            f"A fixed-capacity KV buffer of {self.capacity} slots cannot hold {size}: the static decoding step was "
            "sized too small (a bug in hf_triforce; cuda_graphs=False avoids the static path)."
        )


class SlotWrites:
    """Mixin for cache layers over a :class:`StaticKVBuffer` ``self.buffer`` and a shared ``self.slots``.

    ``update`` writes at the step's slots and returns the whole fixed-capacity storage; the causal mask
    (built by the step runner from the same slots) hides the slots after the step's last one.
    """

    buffer: StaticKVBuffer
    slots: StepSlots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.slots.positions is None:
            raise RuntimeError("A static cache layer was updated outside a StaticStepRunner step (no slots set).")
        self.is_initialized = True
        return self.buffer.index_write(self.slots.positions, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffer.capacity, 0

    def advance(self, count: int) -> None:
        """Make the ``count`` slots the last step wrote visible (host-side bookkeeping)."""
        self.buffer.advance(count)
