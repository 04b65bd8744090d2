"""Where level 1's view lives and how its forwards run, chosen once per call from its plan (:func:`level1_steps`):
:class:`ViewSteps` (dynamic shapes) or :class:`StaticSteps` (fixed shapes). Level 1 only drafts: neither can change
the output.
"""

from __future__ import annotations

import contextlib

import torch

from ..caches.retrieval import RetrievalCache
from ..caches.slots import SlotMask, ViewSlots
from ..caches.static_view import StaticRetrievalView, StaticViewSlots
from ..caches.view import RetrievalView
from ..config import TriForceConfig
from ..hf.attention import slot_attention, tree_attention, view_attention
from ..hf.direct_forward import DirectDecoder, direct_decoder
from ..hf.linears import level1_linears
from ..hf.versions import cache_kwargs
from .static_steps import RunnerSlot, StaticStepRunner, weights_signature


def level1_steps(
    model: torch.nn.Module,
    cache: RetrievalCache,
    config: TriForceConfig,
    plan,
    masked_slots: SlotMask | None,
    runner_slot: RunnerSlot | None = None,
) -> ViewSteps:
    """Level 1's storage and forward for a call, as its :class:`~hf_triforce.generation.plan.CallPlan` says;
    ``masked_slots``: the full cache's slots when rows carry padding or holes.

    Example:
        >>> steps = level1_steps(model, cache, TriForceConfig(), plan, None)  # doctest: +SKIP
    """
    if plan.level1_forward == "direct":
        return ViewSteps(model, cache, config, masked_slots, direct=direct_decoder(model, plan.level1_weights))
    if plan.level1_steps != "dynamic":
        return StaticSteps(model, cache, config, masked_slots, plan, runner_slot)
    return ViewSteps(model, cache, config, masked_slots)


class ViewSteps:
    """Level 1 over a :class:`~hf_triforce.caches.view.RetrievalView` built at each re-selection, run by the direct
    forward (its own weights or int8/int4 copy) or transformers' (inside
    :func:`~hf_triforce.hf.linears.level1_linears`: the copy the call swapped in, if any).

    Args:
        slots: the full cache's slots when rows carry padding or holes (masked per row and KV head), else ``None``.
        direct: level 1's direct forward (one unpadded row), or ``None``: transformers' forward.

    Example:
        >>> steps = ViewSteps(model, cache, TriForceConfig(), None)  # doctest: +SKIP
        >>> steps.select(cache.select(queries, 512, 128))  # doctest: +SKIP
        >>> steps.logits(ids, positions=[900]).shape  # [B, q, V]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: RetrievalCache,
        config: TriForceConfig,
        slots: SlotMask | None,
        direct: DirectDecoder | None = None,
    ) -> None:
        self.model, self.cache, self.config, self.slots = model, cache, config, slots
        self.direct = direct
        self.view: RetrievalView | StaticRetrievalView | None = None
        self.view_slots: ViewSlots | None = None

    def select(self, indices: list[torch.Tensor]) -> None:
        """The view of the tokens at per-layer ``indices`` ``[B, H_kv, S]`` (in the last view's storage, if any)."""
        if self.view is None:
            self.view = self.cache.sparse_view(indices, self.config.view_extra_capacity)
        else:
            self.view.refresh(indices)
        if self.slots is not None:
            self.view_slots = ViewSlots(self.cache.gathered_validity(indices, self.slots), self.slots.valid[:, :0])

    def sync(self) -> None:
        """Drop the last round's drafts and copy in the full cache's tokens since the selection (a batch's sliding
        layers: their last slots again, :meth:`~hf_triforce.caches.view.SparseViewMixin.sync`)."""
        packed = self.view.sync(self.slots)
        if self.slots is not None:
            self.view_slots.tail = self.slots.valid[:, self.view.source_length :]
            for layer, valid, covered in packed:
                self.view_slots.cover(layer, valid, covered)

    def logits(self, inputs: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """float32 logits ``[B, q, V]`` of ``inputs`` ``[B, q]``, row ``b`` at true positions ``positions[b] ..``,
        appended to the view."""
        q = inputs.shape[1]
        start = torch.tensor(positions, device=inputs.device)[:, None]
        if self.slots is not None:
            self.view_slots.append(q)
        return self._forward(inputs, start + torch.arange(q, device=inputs.device))

    def tree_logits(self, tokens: torch.Tensor, position: int, visibility: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[q, V]`` of one depth of token-tree nodes ``tokens`` ``[q]`` at true ``position``, appended
        to the view; node ``i`` sees the view and the last ``m`` keys where ``visibility[i]`` (``[q, m]``) is set."""
        positions = torch.full((1, tokens.shape[0]), position, device=tokens.device)
        return self._forward(tokens[None], positions, visibility.to(tokens.device))[0]

    def _forward(
        self, inputs: torch.Tensor, positions: torch.Tensor, visibility: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 logits ``[B, q, V]`` of ``inputs`` ``[B, q]`` at ``positions`` ``[B, q]`` over the view."""
        q = inputs.shape[1]
        with contextlib.ExitStack() as stack:
            if visibility is not None:
                stack.enter_context(tree_attention(self.model, visibility))
            if self.direct is not None:
                return self.direct.logits(inputs[0], positions[0], self.view)[None]
            stack.enter_context(level1_linears())
            if self.slots is not None:
                stack.enter_context(slot_attention(self.model, self.view_slots))
            elif visibility is None:
                stack.enter_context(view_attention(self.model))
            out = self.model(
                input_ids=inputs, position_ids=positions, use_cache=True, logits_to_keep=q, **cache_kwargs(self.view)
            )
        return out.logits[:, -q:].float()

    def keep(self, kept: list[int], width: int) -> None:
        """Of a step's last ``width`` view slots, row ``b`` keeps its first ``kept[b]``; the rest leave the view."""
        if self.slots is None:
            self.view.crop(-(width - max(kept)))
            return
        self.view.crop(self.view_slots.keep(torch.tensor(kept), width))

    def forget(self) -> None:
        """Rows left the call: the view is selected again before the next level-1 step."""
        self.view, self.view_slots = None, None


class StaticSteps(ViewSteps):
    """Level 1 on a fixed-capacity view rewritten in place, run by a
    :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` (``plan.level1_steps``: graphs per width ``1 ..
    gamma1 + 1``, or eager). One unpadded row's runner is kept in ``runner_slot`` between calls; a batch's is rebuilt
    when rows leave (its storage holds one slot range per row). ``plan.strict_graphs``: a failed capture raises.
    """

    def __init__(self, model, cache, config, slots, plan, runner_slot: RunnerSlot | None) -> None:
        super().__init__(model, cache, config, slots)
        self.mode, self.strict = plan.level1_steps, plan.strict_graphs
        self.runner_slot = runner_slot if slots is None else None
        self.runner: StaticStepRunner | None = None
        self.view_slots: StaticViewSlots | None = None  # the runner's: made with it

    def select(self, indices: list[torch.Tensor]) -> None:
        if self.runner is None:
            self.runner = self._runner(self.config.view_capacity)
        self.runner.cache.refresh(indices)
        self.view = self.runner.cache
        if self.view_slots is not None:
            self.view_slots.refresh(indices)

    def sync(self) -> None:
        packed = self.view.sync(self.slots)
        if self.view_slots is not None:
            self.view_slots.sync(packed)

    def logits(self, inputs: torch.Tensor, positions: list[int]) -> torch.Tensor:
        if self.view_slots is not None:
            self.view_slots.append(inputs.shape[1])
        with level1_linears():
            return self.runner.step(inputs, positions)

    def forget(self) -> None:
        """Rows left: a new runner (storage for the rows that remain) at the next selection."""
        super().forget()
        self.runner = None

    def _runner(self, capacity: int) -> StaticStepRunner:
        """The one an earlier call of this model kept (same shapes and weights), else a new one."""
        graphs, strict = self.mode == "graphs", self.strict
        key = (capacity, self.config.gamma1, graphs, strict, len(self.cache.layers))
        kept = None if self.runner_slot is None else self.runner_slot.level1_runner
        key += () if self.runner_slot is None else weights_signature(self.model)
        if kept is not None and kept[0] == key:
            kept[1].cache.rebind(self.cache)
            return kept[1]
        view = StaticRetrievalView(self.cache, capacity)
        self.view_slots = None if self.slots is None else StaticViewSlots(view, self.slots)
        widths = range(1, self.config.gamma1 + 2)
        runner = StaticStepRunner(
            self.model, view, widths, use_graphs=graphs, strict=strict, slot_validity=self.view_slots
        )
        if self.runner_slot is not None:
            self.runner_slot.level1_runner = (key, runner)
        return runner
