"""Fixed-capacity key/value storage written at slots given by a tensor: the cache side of a static-shape step.

A CUDA graph replays on the addresses seen at capture, so its cache must never reallocate and must take *where* to
write from a device tensor. ``update`` changes no Python state: the step runner advances the host-side ``length``
after a step, so an eager step and a graph replay have the same effect.
"""

from __future__ import annotations

import torch

from ..errors import InternalError
from .buffers import KVBuffer


class StepSlots:
    """The cache slots ``[q]`` (long, on the model's device) the current step writes; shared by all layers."""

    def __init__(self) -> None:
        self.positions: torch.Tensor | None = None


class StaticKVBuffer(KVBuffer):
    """A :class:`KVBuffer` allocated once, zero-filled, never reallocated.

    Zeros, not uninitialized memory: a masked slot gets weight 0, but ``0 * NaN`` would still poison the output.

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
        """:meth:`KVBuffer.index_write`, allocating the storage on first use."""
        self.reserve(self.capacity, key_states)
        return super().index_write(slots, key_states, value_states)

    def _overflow(self, size: int) -> RuntimeError:
        return RuntimeError(
            f"A fixed-capacity KV buffer of {self.capacity} slots cannot hold {size}: the static decoding step was "
            "sized too small (a bug in hf_triforce; cuda_graphs=False avoids the static path)."
        )


class SlotWrites:
    """Mixin for cache layers over a :class:`StaticKVBuffer` ``self.buffer`` and a shared ``self.slots``.

    ``update`` writes at the step's slots and returns the whole storage; the step runner's mask hides later slots.
    """

    buffer: StaticKVBuffer
    slots: StepSlots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.slots.positions is None:
            raise InternalError("A static cache layer was updated outside a StaticStepRunner step (no slots set).")
        self.is_initialized = True
        return self.buffer.index_write(self.slots.positions, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffer.capacity, 0
