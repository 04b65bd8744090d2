"""Static-shape decoding steps (level 1 over the retrieval view, level 0 over the draft cache) and CUDA graphs.

A :class:`StaticStepRunner` runs a model over a fixed-capacity cache with static input buffers per query width. On
CUDA it captures one graph per graphed width (one shared memory pool) and replays it; otherwise the same static
forward runs eagerly, the CPU reference the tests check against the dynamic-shape path.

Nothing in the captured forward may read the host:

* we pass our own 4D mask, built on the device from the slot tensor (transformers' sdpa mask code compares the
  query offset on the host and drops a one-token query's mask), so the cache's ``get_query_offset``/
  ``get_mask_sizes``/``get_seq_length`` are never called and our layers stay ``is_compileable = False``;
* ``position_ids`` are always given (the default reads ``get_seq_length()``, a Python int);
* ``update`` writes with ``index_copy_`` at the slots tensor; the runner advances host-side lengths after the step;
* ``dynamic``/``longrope`` RoPE (reads ``max(position_ids)``), attention other than sdpa/eager, and models dispatched
  by accelerate are refused (the call's plan); sliding-window models get the full causal mask over the view (only
  drafts can change);
* the logits processors, the judging, re-selection, ``sync``/``crop``/eviction and the copy of the step's inputs
  into the static buffers run outside the captured region.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any, Literal, Protocol

import torch
from transformers import Cache

from ..errors import InternalError, UnsupportedModelError
from ..hf.attention import slot_attention
from ..hf.masks import MaskKind, mask_kind
from ..hf.versions import cache_kwargs

logger = logging.getLogger(__name__)

StepMode = Literal["dynamic", "eager", "graphs"]
WARMUP_STEPS = 2  # eager forwards on the side stream before a capture (idempotent: same slots, same states)


def static_causal_mask(
    slots: torch.Tensor, slot_range: torch.Tensor, kind: MaskKind, dtype: torch.dtype
) -> torch.Tensor:
    """The ``[1, 1, q, capacity]`` causal mask of a step writing ``slots`` ``[q]`` (ascending): query ``i`` sees
    slots ``<= slots[i]``; ``slot_range``: ``arange(capacity)``; ``kind``: ``"bool"`` (sdpa) or ``"additive"``.

    Example:
        >>> static_causal_mask(torch.tensor([2, 3]), torch.arange(5), "bool", torch.float32)[0, 0].int().tolist()
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    """
    visible = (slot_range[None, :] <= slots[:, None])[None, None]
    if kind == "bool":
        return visible
    zero = torch.zeros((), dtype=dtype, device=slots.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


class _StepInputs:
    """Static input buffers of one query width ``q`` for ``B`` rows: token ids and true positions ``[B, q]``, cache
    slots ``[q]`` (every row writes the same slots)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.offsets = torch.arange(width, device=device)
        self.ids = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.first = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.slots = torch.zeros(width, dtype=torch.long, device=device)

    def load(self, tokens: torch.Tensor, first_positions: torch.Tensor, first_slot: int) -> None:
        self.ids.copy_(tokens, non_blocking=True)
        self.first.copy_(first_positions[:, None], non_blocking=True)
        torch.add(self.offsets, self.first, out=self.positions)
        torch.add(self.offsets, first_slot, out=self.slots)


class StaticStepRunner:
    """Runs decoding steps of ``model`` over a fixed-capacity ``cache``, eagerly or as replayed CUDA graphs.

    Args:
        cache: :class:`~hf_triforce.caches.static_buffer.SlotWrites` layers sharing one ``slots`` holder (a
            ``StaticRetrievalView``, or a ``StreamingLLMCache`` after ``use_static_layers``).
        graph_widths: query widths to capture as CUDA graphs (others run eagerly on the same buffers).
        use_graphs: capture/replay graphs (CUDA only).
        logits_to_keep: rows of logits to return (0: all ``q``).
        strict: re-raise a failed capture instead of falling back to eager steps (``cuda_graphs=True``).
        slot_validity: rows with padding or holes: the key slots each row may attend (``[B, H_kv, capacity]`` bool
            per layer at a fixed address, :class:`~hf_triforce.caches.static_view.StaticViewSlots`); ``None``: one row.

    Example:
        >>> runner = StaticStepRunner(model, view, graph_widths=range(1, 4), use_graphs=False)  # doctest: +SKIP
        >>> logits = runner.step(torch.tensor([5, 7]), first_position=1000)  # [2, V] float32  # doctest: +SKIP
        >>> logits = runner.step(torch.tensor([[5, 7], [6, 8]]), [1000, 990])  # two rows: [2, 2, V]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: Cache,
        graph_widths: Iterable[int] = (),
        use_graphs: bool = False,
        logits_to_keep: int = 0,
        strict: bool = False,
        slot_validity: Any = None,
    ) -> None:
        kind = mask_kind(model)
        if kind is None:  # the call's plan never asks for fixed shapes then
            raise UnsupportedModelError("Fixed-shape steps need sdpa or eager attention.")
        self.model, self.cache, self.kind = model, cache, kind
        self.slots = cache.layers[0].slots
        self.capacity = cache.layers[0].buffer.capacity
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.graph_widths = set(graph_widths)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.logits_to_keep, self.strict = logits_to_keep, strict
        self.slot_range = torch.arange(self.capacity, device=self.device)
        self._inputs: dict[int, _StepInputs] = {}
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self._stream: torch.cuda.Stream | None = None
        self.counts = {"eager": 0, "replay": 0, "capture": 0}
        self.slot_validity = slot_validity

    @property
    def visible_length(self) -> int:
        return self.cache.layers[0].buffer.length

    def step(self, tokens: torch.Tensor, first_position: int | list[int]) -> torch.Tensor:
        """Forward ``tokens`` ``[q]`` or ``[B, q]`` at true positions ``first_position ..`` (one per row) into the next
        ``q`` free slots: fresh float32 logits ``[k, V]`` or ``[B, k, V]`` (``k = logits_to_keep or q``)."""
        rows = tokens if tokens.dim() == 2 else tokens[None]
        q, start = rows.shape[1], self.visible_length
        if start + q > self.capacity:
            raise InternalError(f"A {q}-token step after {start} slots overflows the static cache ({self.capacity}).")
        inputs = self._inputs.get(q) or self._inputs.setdefault(q, _StepInputs(rows.shape[0], q, self.device))
        firsts = first_position if isinstance(first_position, list) else [first_position]
        inputs.load(rows, torch.tensor(firsts), start)
        if self.use_graphs and q in self.graph_widths:
            logits = self._replay(q, inputs)
        else:
            logits = self._forward(inputs)
            self.counts["eager"] += 1
        for layer in self.cache.layers:
            layer.advance(q)
        logits = logits if tokens.dim() == 2 else logits[0]
        return logits.to(torch.float32, copy=True)

    def _forward(self, inputs: _StepInputs) -> torch.Tensor:
        """The static forward (what a graph captures): ``[B, k, V]`` logits in the model's dtype."""
        self.slots.positions = inputs.slots
        mask = static_causal_mask(inputs.slots, self.slot_range, self.kind, self.dtype)
        q = inputs.ids.shape[1]
        with contextlib.ExitStack() as stack:
            if self.slot_validity is not None:
                self.slot_validity.query_slots = inputs.slots
                stack.enter_context(slot_attention(self.model, self.slot_validity))
            out = self.model(
                input_ids=inputs.ids,
                position_ids=inputs.positions,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=self.logits_to_keep or q,
                **cache_kwargs(self.cache),
            )
        return out.logits

    def _replay(self, q: int, inputs: _StepInputs) -> torch.Tensor:
        if q not in self._graphs:
            try:
                self._capture(q, inputs)
            except RuntimeError as err:  # a capture-unsafe operation inside the model's forward
                if self.strict:
                    raise
                logger.warning("CUDA graph capture failed for width %d, running these steps eagerly: %s", q, err)
                self.use_graphs = False
                self.counts["eager"] += 1
                return self._forward(inputs)
        graph, output = self._graphs[q]
        graph.replay()
        self.counts["replay"] += 1
        return output

    def _capture(self, q: int, inputs: _StepInputs) -> None:
        """Warm up on a side stream, then capture width ``q`` into the shared pool. The warm-up forwards write what
        the replay that follows writes again, so they leave the cache as one step would."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                self._forward(inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            output = self._forward(inputs)
        self._pool = graph.pool()
        self._graphs[q] = (graph, output)
        self.counts["capture"] += 1


class RunnerSlot(Protocol):
    """Where a level-1 runner is kept between ``generate()`` calls (the enabled model's state object): ``(key,
    runner)``, the key ending with :func:`weights_signature` (graphs replay the addresses they captured). It saves
    each call its graph captures; :func:`hf_triforce.disable` drops it. Not for concurrent calls on one model."""

    level1_runner: tuple[tuple, StaticStepRunner] | None


def weights_signature(model: torch.nn.Module) -> tuple:
    """Addresses, dtype and device of the first and the output weights: changed by ``.to()`` or reloading."""
    first = next(model.parameters())
    return first.data_ptr(), model.get_output_embeddings().weight.data_ptr(), first.dtype, first.device
