"""Where level 1's view lives and how its forwards run: the storage/step strategies of the one level-1 drafter.

:class:`~hf_triforce.hierarchy.level1.Level1Drafter` drafts every row of a call the same way whatever runs its
forwards; what differs is one of these, chosen once per call (:func:`level1_steps`):

* :class:`ModelSteps`: a :class:`~hf_triforce.caches.view.RetrievalView` built at each re-selection (dynamic
  shapes), transformers' forward over it (optionally on level 1's int8 or int4 weight copy). A call whose rows carry
  padding or holes (a batch, a left-padded row) attends through each row's slot validity
  (:class:`~hf_triforce.caches.slots.ViewSlots`).
* :class:`DirectSteps`: the same storage, level 1's direct forward (:mod:`hf_triforce.hf.direct_forward`: plain
  torch calls, int8 or int4 weights), optionally re-ranking chunks inside every forward
  (:class:`~hf_triforce.caches.chunk_swap.ChunkSwapper`, ``step_selection``).
* :class:`StaticSteps`: a fixed-capacity :class:`~hf_triforce.caches.static_view.StaticRetrievalView` rewritten in
  place at each re-selection and a :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` (CUDA graphs per
  width, or the same fixed-shape forward eagerly), rows with padding or holes masked by a fixed-capacity slot
  validity.

Each strategy answers the same four calls: :meth:`select` (a new selection), :meth:`sync` (the full cache's tokens
since), :meth:`logits` (one level-1 forward of every row) and :meth:`keep` (crop what a step's verdicts rejected).
Level 1 only drafts: no strategy can change the output, only how fast and how well level 1 drafts.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ..caches.chunk_swap import HOLD, ChunkSwapper
from ..caches.retrieval import RetrievalCache
from ..caches.selection import EVERY_CHUNK
from ..caches.slots import SlotMask, ViewSlots, gathered_validity
from ..caches.static_view import StaticRetrievalView, StaticViewSlots
from ..caches.view import RetrievalView
from ..config import TriForceConfig
from ..hf.attention import slot_attention, tree_attention, view_attention
from ..hf.direct_forward import DirectDecoder
from ..hf.linears import LowBitCopy, low_bit_linears
from ..hf.versions import cache_kwargs
from ..stats import TriForceStats
from .static_steps import RunnerSlot, StaticStepRunner, StepMode, keep_runner, kept_runner


class ModelSteps:
    """Level 1 over a dynamic :class:`~hf_triforce.caches.view.RetrievalView`, through the model's own forward.

    Args:
        model: the target model.
        cache: the full :class:`~hf_triforce.caches.retrieval.RetrievalCache` views are selected from.
        config: the call's :class:`~hf_triforce.config.TriForceConfig`.
        slots: the full cache's :class:`~hf_triforce.caches.slots.SlotMask` when rows carry padding or holes (the
            view's slots are then masked per row and KV head), else ``None`` (one unpadded row: causal attention).
        low_bit: level 1's int8 or int4 weight copy, or ``None`` for the model's own weights.

    Example:
        >>> steps = ModelSteps(model, cache, TriForceConfig(), None, None)  # doctest: +SKIP
        >>> steps.select(cache.select(queries, 512, 128))  # doctest: +SKIP
        >>> steps.logits(ids, positions=[900]).shape  # [B, q, V]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: RetrievalCache,
        config: TriForceConfig,
        slots: SlotMask | None,
        low_bit: LowBitCopy | None,
    ) -> None:
        self.model, self.cache, self.config, self.slots, self.low_bit = model, cache, config, slots, low_bit
        self.view: RetrievalView | StaticRetrievalView | None = None
        self.view_slots: ViewSlots | None = None

    def select(self, indices: list[torch.Tensor], nominees: list[torch.Tensor] | None = None) -> None:
        """A new view of the tokens at per-layer ``indices`` ``[B, H_kv, S]`` (``nominees``: see
        :class:`DirectSteps`)."""
        self.view = self.cache.sparse_view(indices, self.config.view_extra_capacity)
        if self.slots is not None:
            valid = self.slots.valid
            self.view_slots = ViewSlots([gathered_validity(valid, idx) for idx in indices], valid[:, valid.shape[1] :])

    def sync(self) -> None:
        """Drop the last round's drafts and copy in the full cache's tokens since the selection."""
        self.view.sync()
        if self.slots is not None:
            self.view_slots.tail = self.slots.valid[:, self.view.source_length :]

    def logits(self, inputs: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """float32 logits ``[B, q, V]`` of ``inputs`` ``[B, q]``, row ``b`` at true positions ``positions[b] ..``,
        appended to the view."""
        q = inputs.shape[1]
        start = torch.tensor(positions, device=inputs.device)[:, None]
        position_ids = start + torch.arange(q, device=inputs.device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(low_bit_linears(self.low_bit))
            if self.slots is None:
                stack.enter_context(view_attention(self.model))
            else:
                self.view_slots.append(q)
                stack.enter_context(slot_attention(self.model, self.view_slots))
            out = self.model(
                input_ids=inputs, position_ids=position_ids, use_cache=True, logits_to_keep=q,
                **cache_kwargs(self.view),
            )  # fmt: skip
        return out.logits[:, -q:].float()

    def tree_logits(self, tokens: torch.Tensor, position: int, visibility: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[q, V]`` of one sequence's token-tree nodes ``tokens`` ``[q]``, all at true ``position``
        (one depth), appended to the view; node ``i`` sees the view and the tree's keys where ``visibility[i]``
        (``[q, m]``: the last ``m`` keys are the tree's, these nodes last) is ``True``."""
        q = tokens.shape[0]
        position_ids = torch.full((1, q), position, device=tokens.device)
        with low_bit_linears(self.low_bit), tree_attention(self.model, visibility.to(tokens.device)):
            out = self.model(
                input_ids=tokens[None], position_ids=position_ids, use_cache=True, logits_to_keep=q,
                **cache_kwargs(self.view),
            )  # fmt: skip
        return out.logits[0, -q:].float()

    def keep(self, kept: list[int], width: int) -> None:
        """Of a step's last ``width`` view slots, row ``b`` keeps its first ``kept[b]`` (its accepted drafts and the
        token level 1 chose); the rest leave the view."""
        if self.slots is None:
            self.view.crop(-(width - max(kept)))
            return
        self.view.crop(self.view_slots.keep(torch.tensor(kept), width))

    def forget(self) -> None:
        """Rows left the call: the view is selected again before the next level-1 step."""
        self.view, self.view_slots = None, None

    def tail_length(self) -> int | None:
        """Full-cache tokens added since the selection (``None``: no view yet)."""
        return None if self.view is None else self.view.tail_length()


class DirectSteps(ModelSteps):
    """Level 1's direct forward over a dynamic view (one unpadded row): plain torch calls on the model's weights or
    their int8/int4 copy; with ``step_selection``, each layer re-ranks the refresh's nominated chunks with its own
    query before it attends (:class:`~hf_triforce.caches.chunk_swap.ChunkSwapper`).

    Args:
        model, cache, config: as :class:`ModelSteps`.
        direct: the model's :class:`~hf_triforce.hf.direct_forward.DirectDecoder`.
        stats: the call's statistics (the ``reselect`` phase and ``chunks_swapped``).
    """

    def __init__(self, model, cache, config, direct: DirectDecoder, stats: TriForceStats) -> None:
        super().__init__(model, cache, config, None, None)
        self.direct, self.stats = direct, stats
        self.swapper: ChunkSwapper | None = None
        self._reselect_seconds, self._swapped = 0.0, 0  # the re-rankings of the forward in progress

    def select(self, indices: list[torch.Tensor], nominees: list[torch.Tensor] | None = None) -> None:
        """A new view; with ``nominees`` (chunks per layer a refresh nominated), a swapper that re-ranks them inside
        every forward. A held chunk stays while it ranks within the top ``(1 + HOLD) k``; on CUDA the swapper never
        waits for the device."""
        super().select(indices)
        if nominees is None:
            self.swapper = None
            return
        cfg = self.config
        settings = (cfg.retrieval_budget, cfg.recent_tokens, cfg.lookahead_chunks, EVERY_CHUNK)
        sync_free = swaps_without_waiting(self.model)
        self.swapper = ChunkSwapper(self.view, indices, *settings, hold=HOLD, nominees=nominees, sync_free=sync_free)

    def logits(self, inputs: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """The direct forward of the one row ``inputs`` ``[1, q]``; with a swapper, each layer re-ranks first (the
        ``reselect`` phase: one call per forward, summed over its layers; on CUDA the time to queue it)."""
        if self.swapper is None:
            return self.direct.logits(inputs[0], positions[0], self.view)[None]
        self._reselect_seconds, self._swapped = 0.0, 0
        logits = self.direct.logits(inputs[0], positions[0], self.view, self._reselect_layer)
        self.stats.phases.add("reselect", self._reselect_seconds)
        self.stats.chunks_swapped += int(self._swapped)  # the forward is queued: reading it waits only as logits do
        return logits[None]

    def tree_logits(self, tokens: torch.Tensor, position: int, visibility: torch.Tensor) -> torch.Tensor:
        """:meth:`ModelSteps.tree_logits` through the direct forward."""
        positions = torch.full_like(tokens, position)
        with tree_attention(self.model, visibility.to(tokens.device)):
            return self.direct.logits(tokens, positions, self.view)

    def _reselect_layer(self, layer: int, query: torch.Tensor) -> None:
        """Before layer ``layer``'s attention: re-rank its chunks with its post-RoPE queries ``[1, H_q, q, D]`` (all
        ``q`` of them: a chunk counts if any of them needs it)."""
        start = time.perf_counter()
        self._swapped += self.swapper.reselect_layer(layer, query.reshape(1, -1, query.shape[-1]))
        self._reselect_seconds += time.perf_counter() - start


class StaticSteps(ModelSteps):
    """Level 1 on fixed shapes: a :class:`~hf_triforce.caches.static_view.StaticRetrievalView` rewritten in place and
    a :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` (CUDA graphs per width ``1 .. gamma1 + 1``, or
    the same forward eagerly). One unpadded row's runner is kept on the model between calls of the same shapes; rows
    with padding or holes attend through a fixed-capacity slot validity
    (:class:`~hf_triforce.caches.static_view.StaticViewSlots`), and their runner is rebuilt when rows leave (its
    storage holds one slot range per row).

    Args:
        model, cache, config, slots, low_bit: as :class:`ModelSteps`.
        mode: ``"graphs"`` or ``"eager"``.
        runner_slot: where one unpadded row's runner is kept between calls (the model's state), or ``None``.
    """

    def __init__(self, model, cache, config, slots, low_bit, mode: StepMode, runner_slot: RunnerSlot | None) -> None:
        super().__init__(model, cache, config, slots, low_bit)
        self.mode, self.runner_slot = mode, runner_slot if slots is None else None
        self.runner: StaticStepRunner | None = None
        self.view_slots: StaticViewSlots | None = None  # the runner's: made with it

    def select(self, indices: list[torch.Tensor], nominees: list[torch.Tensor] | None = None) -> None:
        if self.runner is None:
            self.runner = self._runner(self.config.view_capacity)
        self.runner.cache.refresh(indices)
        self.view = self.runner.cache
        if self.view_slots is not None:
            self.view_slots.refresh(indices)

    def sync(self) -> None:
        self.view.sync()
        if self.view_slots is not None:
            self.view_slots.sync()

    def logits(self, inputs: torch.Tensor, positions: list[int]) -> torch.Tensor:
        if self.view_slots is not None:
            self.view_slots.append(inputs.shape[1])
        with low_bit_linears(self.low_bit):
            return self.runner.step(inputs, positions)

    def forget(self) -> None:
        """Rows left: a new runner (storage for the rows that remain) at the next selection."""
        super().forget()
        self.runner = None

    def _runner(self, capacity: int) -> StaticStepRunner:
        """The one an earlier call of this model kept (same shapes and weights), else a new one."""
        graphs, strict = self.mode == "graphs", self.config.cuda_graphs is True
        key = (capacity, self.config.gamma1, graphs, strict, len(self.cache.layers))
        runner = None if self.runner_slot is None else kept_runner(self.runner_slot, self.model, key)
        if runner is not None:
            runner.cache.rebind(self.cache)
            return runner
        view = StaticRetrievalView(self.cache, capacity)
        self.view_slots = None if self.slots is None else StaticViewSlots(view, self.slots)
        widths = range(1, self.config.gamma1 + 2)
        runner = StaticStepRunner(
            self.model, view, widths, use_graphs=graphs, strict=strict, slot_validity=self.view_slots
        )
        if self.runner_slot is not None:
            keep_runner(self.runner_slot, self.model, key, runner)
        return runner


def swaps_without_waiting(model: torch.nn.Module) -> bool:
    """Whether level 1's :class:`ChunkSwapper` re-ranks in fixed shapes, never waiting for the device
    (``sync_free``): on CUDA, where waiting inside a layer stalls the queued forward.

    Example:
        >>> swaps_without_waiting(torch.nn.Linear(2, 2))
        False
    """
    return next(model.parameters()).device.type == "cuda"
