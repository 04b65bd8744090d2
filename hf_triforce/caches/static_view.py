"""``StaticRetrievalView``: the level-1 sparse view on fixed-capacity storage, for static-shape (CUDA graph) steps.

A re-selection rewrites the storage in place, so captured graphs stay valid; host-side state changes between steps.
"""

from __future__ import annotations

import torch

from ..errors import InvalidInputError
from .base import BufferedCache, BufferedLayer
from .retrieval import RetrievalCache
from .slots import SlotMask, ViewSlots
from .static_buffer import SlotWrites, StaticKVBuffer, StepSlots
from .view import SparseViewMixin, gather_selection


class StaticViewLayer(SlotWrites, BufferedLayer):
    """One layer of a :class:`StaticRetrievalView`: ``capacity`` fixed slots, the first ``static_length`` gathered."""

    def __init__(self, capacity: int, slots: StepSlots) -> None:
        super().__init__(StaticKVBuffer(capacity))
        self.slots = slots
        self.static_length = 0

    def get_max_length(self) -> int:
        return self.buffer.capacity


class StaticRetrievalView(SparseViewMixin, BufferedCache):
    """A fixed-capacity sparse view of a :class:`RetrievalCache`, rewritten in place at every re-selection.

    ``get_seq_length()`` is the *true* length, ``visible_length`` the compacted slots in use. Forwards go through a
    :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` (slots, mask, true ``position_ids``, then the visible
    length advanced). ``capacity``: the budget plus the tokens appended until the next re-selection and some drafts.

    Example:
        >>> source = RetrievalCache(num_layers=1, chunk_size=4, capacity=32)
        >>> _ = source.update(torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), layer_idx=0)
        >>> view = StaticRetrievalView(source, capacity=16)
        >>> view.refresh([torch.arange(8).expand(1, 2, 8)])
        >>> view.visible_length, view.get_seq_length(), view.layers[0].buffer.storage[0].shape
        (8, 20, torch.Size([1, 2, 16, 8]))
    """

    def __init__(self, source: RetrievalCache, capacity: int) -> None:
        self.slots = StepSlots()
        super().__init__(layers=[StaticViewLayer(capacity, self.slots) for _ in source.layers])
        self.source = source
        self.source_length = 0
        self.capacity = capacity

    def rebind(self, source: RetrievalCache) -> None:
        """Serve another full cache (a later ``generate()``), keeping storage and CUDA graphs; empty until refreshed.

        Raises:
            ValueError: ``source`` has another number of layers.
        """
        if len(source.layers) != len(self.layers):
            raise InvalidInputError(f"a {len(self.layers)}-layer view cannot serve a {len(source.layers)}-layer cache.")
        self.source, self.source_length = source, 0
        for layer in self.layers:
            layer.static_length = layer.buffer.length = 0

    def refresh(self, indices: list[torch.Tensor]) -> None:
        """Gather the tokens at per-layer ``indices`` ``[B, H_kv, S <= capacity]`` into slots ``0 .. S``, in place.

        Every layer's steps write at the same slots: a layer given fewer indices (a sliding layer whose window is
        shorter than the others' selection) gets them at the end of ``0 .. S``, after zero keys and values (a row's
        slots are masked there, :class:`StaticViewSlots`; a lone sequence's level 1 attends to them: drafts only).
        """
        width = max(idx.shape[-1] for idx in indices)
        for view_layer, layer, idx in zip(self.layers, self.source.layers, indices, strict=True):
            pad = width - idx.shape[-1]
            if pad:
                view_layer.buffer.reserve(width, layer.buffer.like())
                keys, values = view_layer.buffer.storage
                keys[:, :, :pad].zero_(), values[:, :, :pad].zero_()
            view_layer.static_length = pad + gather_selection(view_layer.buffer, layer.buffer, layer.local(idx), pad)
        self.source_length = self.source.get_seq_length()


class StaticViewSlots:
    """Which slots of a batched :class:`StaticRetrievalView` each row may attend to, as one
    ``[layers, B, H_kv, capacity]`` bool tensor allocated once (CUDA graphs read it at a fixed address).

    The fixed-capacity :class:`~hf_triforce.caches.slots.ViewSlots`: gathered slots and the tail take their source's
    validity (``slots``), a step's own slots are valid while it runs, a row's rejected drafts leave, unwritten slots are
    never valid. Kept current between steps; the step runner sets :attr:`query_slots` before each forward.

    Example:
        >>> source = RetrievalCache(num_layers=1, chunk_size=4, capacity=32)
        >>> _ = source.update(torch.randn(2, 1, 12, 8), torch.randn(2, 1, 12, 8), layer_idx=0)
        >>> view = StaticRetrievalView(source, capacity=16)
        >>> slots = StaticViewSlots(view, SlotMask(torch.tensor([[0] * 4 + [1] * 8, [1] * 12])))
        >>> view.refresh([torch.arange(12).expand(2, 1, 12)]); slots.refresh([torch.arange(12).expand(2, 1, 12)])
        >>> slots.for_layer(0)[:, 0, :13].int().tolist()  # row 0's first 4 slots are padding; slot 12 unwritten
        [[0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]]
    """

    def __init__(self, view: StaticRetrievalView, slots: SlotMask) -> None:
        self.view, self.slots = view, slots
        self.valid: torch.Tensor | None = None
        self.query_slots: torch.Tensor | None = None

    def for_layer(self, layer_idx: int) -> torch.Tensor:
        """``[B, H_kv, capacity]`` validity of layer ``layer_idx``'s slots (a view of the fixed tensor)."""
        return self.valid[layer_idx]

    in_window = ViewSlots.in_window  # no window

    def refresh(self, indices: list[torch.Tensor]) -> None:
        """After the view gathered at ``indices``: those slots take their source's validity, later slots none."""
        if self.valid is None:
            shape = (len(indices), *indices[0].shape[:2], self.view.capacity)
            self.valid = torch.zeros(shape, dtype=torch.bool, device=self.slots.valid.device)
        self.valid.zero_()
        width = max(idx.shape[-1] for idx in indices)  # a shorter selection sits at the end (StaticRetrievalView)
        for layer, valid in enumerate(self.view.source.gathered_validity(indices, self.slots)):
            self.valid[layer, :, :, width - valid.shape[-1] : width] = valid

    def sync(self, packed: list[tuple[int, torch.Tensor, int]]) -> None:
        """After the view copied in the tokens since the selection: they take the source's validity, later ones none;
        ``packed``: the sliding layers copied again, with their validity (:meth:`StaticRetrievalView.sync`)."""
        start = self.view.layers[0].static_length
        tail = self.slots.valid[:, self.view.source_length :]
        self.valid[..., start:] = False
        self.valid[..., start : start + tail.shape[1]] = tail[None, :, None, :]
        for layer, valid, _ in packed:
            self.valid[layer, :, :, : valid.shape[1]] = valid[:, None]

    def append(self, width: int) -> None:
        """A step writes the ``width`` slots after the visible ones: valid in every row while it runs."""
        start = self.view.visible_length
        self.valid[..., start : start + width] = True

    def keep(self, kept: torch.Tensor, width: int) -> int:
        """Of the step's last ``width`` slots, row ``b`` keeps its first ``kept[b]``; returns the crop
        (:meth:`~hf_triforce.caches.slots.ViewSlots.keep`)."""
        start, counts = self.view.visible_length - width, kept.tolist()
        for b, n in enumerate(counts):
            self.valid[:, b, :, start + n : start + width] = False
        return -(width - max(counts))
