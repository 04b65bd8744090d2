"""The full-cache verification of one unpadded sequence on fixed shapes (the cache's fixed storage, its end read
from a device tensor): eagerly, or replayed as a CUDA graph per width. No sliding-window layer: the mask is causal."""

from __future__ import annotations

import contextlib

import torch

from ..caches.retrieval import RetrievalCache
from ..hf.attention import QueryCapture, capturing_queries, fixed_capacity_attention
from ..hierarchy.static_steps import StaticStepRunner, StepMode


class FixedShapeVerification:
    """Full-cache verification forwards of one unpadded sequence over the prefilled ``cache``'s fixed storage, its
    queries left in ``capture``; ``widths`` run as CUDA graphs (``mode="graphs"``, ``strict``: raise if one fails)."""

    def __init__(
        self, model: torch.nn.Module, cache: RetrievalCache, capture: QueryCapture, mode: StepMode, widths: range,
        strict: bool = False,
    ) -> None:  # fmt: skip
        self.model, self.capture = model, capture
        self.slots = cache.fix_capacity()
        self.runner = StaticStepRunner(
            model, cache, widths, use_graphs=mode == "graphs", strict=strict, forward_context=self._inside_forward
        )
        self._graph_queries: dict[int, dict[int, torch.Tensor]] = {}

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Forward ``tokens`` ``[q]`` (the last accepted token, then the drafts) into the next ``q`` slots; float32
        logits ``[q, V]``."""
        before = dict(self.runner.counts)
        try:
            logits = self.runner.step(tokens, self.runner.visible_length)
        finally:
            self.slots.positions = None  # forwards outside a step (a later call's prefill) append again
        counts, q = self.runner.counts, tokens.shape[0]  # a replay runs no Python: the capture gets the graph's queries
        if counts["capture"] > before["capture"]:  # kept referenced: the graph's pool never hands their memory on
            self._graph_queries[q] = dict(self.capture.queries)
        if counts["replay"] > before["replay"]:
            self.capture.keep = q
            self.capture.queries = {i: t.clone() for i, t in self._graph_queries[q].items()}
        return logits

    def _inside_forward(self, slots: torch.Tensor) -> contextlib.ExitStack:
        """What the (captured) forward runs inside: the query capture, and the cache's length on the device."""
        stack = contextlib.ExitStack()
        stack.enter_context(capturing_queries(self.model, self.capture, slots.shape[0]))
        stack.enter_context(fixed_capacity_attention(self.model, slots[-1:] + 1))
        return stack
