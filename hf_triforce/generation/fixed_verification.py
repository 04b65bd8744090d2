"""The full-cache verification of one sequence on fixed shapes: eagerly, or replayed as a CUDA graph per width.

A verification forward over a growing cache has a new shape every round (its keys grow), so it cannot be
replayed, and on a GPU its host work is large: on the recorded H100 (8B shape, 128K) transformers' eager forward
took 36.8-40.1 ms for a level-1 step that replays in 12.5 ms, and the verification took 42.9 ms against a ~11 ms
floor, so its host work is probably the larger share (not measured apart). Here the forward runs over the full
cache's fixed storage instead (:meth:`~hf_triforce.caches.retrieval.RetrievalCache.fix_capacity`): the step's keys
and values are written at slots taken from a device tensor, and the attention learns where the
cache ends from a device tensor too (:func:`~hf_triforce.hf.attention.fixed_capacity_attention`: on CUDA with
Triton the split-KV kernel reads the length on the device, so each KV head's keys are read once, the GQA group
folded, no ``repeat_kv`` copy and no mask read; on the CPU grouped sdpa or the model's attention reads the exact
mask over every slot). The same :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` that runs level 1's
static steps runs it: one CUDA graph per verification width (up to ``gamma1 + gamma2 + 1``, level 0's own rounds
included; each captured at its first use),
or the same static forward eagerly (``cuda_graphs="eager"``: the CPU reference the tests compare with plain
``generate()``).

It serves one unpadded sequence whose every layer attends in full (a sliding-window layer needs its window in the
mask; the static mask is plain causal), with the full cache on the device; everything else verifies on the dynamic
path, which is just as exact (the call's plan decides: :mod:`~hf_triforce.generation.plan`).
"""

from __future__ import annotations

import contextlib

import torch

from ..caches.retrieval import RetrievalCache
from ..hf.attention import QueryCapture, capturing_queries, fixed_capacity_attention
from ..hierarchy.static_steps import StaticStepRunner, StepMode


class FixedShapeVerification:
    """Full-cache verification forwards of one unpadded sequence over the cache's fixed storage.

    Args:
        model: the target model.
        cache: the call's full cache, prefilled (its storage is fixed here, see
            :meth:`~hf_triforce.caches.retrieval.RetrievalCache.fix_capacity`).
        capture: the loop's :class:`~hf_triforce.hf.attention.QueryCapture`: after each forward it holds that
            forward's queries, as after a dynamic one (a replayed graph's are copied out of the graph's outputs).
        mode: ``"graphs"`` (CUDA) or ``"eager"``.
        widths: the verification widths to capture as graphs (others run eagerly on the same buffers).
        strict: raise if a capture fails instead of running eagerly (``cuda_graphs=True``).

    Example:
        >>> verifier = FixedShapeVerification(model, cache, capture, "eager", range(1, 8))  # doctest: +SKIP
        >>> verifier.logits(torch.tensor([17, 5, 9])).shape  # the last token and two drafts  # doctest: +SKIP
        torch.Size([3, 49152])
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cache: RetrievalCache,
        capture: QueryCapture,
        mode: StepMode,
        widths: range,
        strict: bool = False,
    ) -> None:
        self.model, self.capture = model, capture
        self.slots = cache.fix_capacity()
        self.runner = StaticStepRunner(
            model, cache, widths, use_graphs=mode == "graphs", strict=strict, forward_context=self._inside_forward
        )
        self._graph_queries: dict[int, dict[int, torch.Tensor]] = {}

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Forward ``tokens`` ``[q]`` (the last accepted token, then the drafts) into the next ``q`` slots of the full
        cache, at positions equal to those slots (one unpadded row); float32 logits ``[q, V]``."""
        before = dict(self.runner.counts)
        try:
            logits = self.runner.step(tokens, self.runner.visible_length)
        finally:
            self.slots.positions = None  # forwards outside a step (a prefill of a later call) append again
        self._queries_after(tokens.shape[0], before)
        return logits

    def _inside_forward(self, slots: torch.Tensor) -> contextlib.ExitStack:
        """What the (captured) forward runs inside: the query capture, and the cache's length on the device."""
        stack = contextlib.ExitStack()
        stack.enter_context(capturing_queries(self.model, self.capture, slots.shape[0]))
        stack.enter_context(fixed_capacity_attention(self.model, slots[-1:] + 1))
        return stack

    def _queries_after(self, q: int, before: dict[str, int]) -> None:
        """A replay runs no Python: give the capture the graph's query outputs (copies, as ``store`` makes);
        a capture's are kept, referenced, so the graph's pool never hands their memory to anything else."""
        counts = self.runner.counts
        if counts["capture"] > before["capture"]:
            self._graph_queries[q] = dict(self.capture.queries)
        if counts["replay"] > before["replay"]:
            self.capture.keep = q
            self.capture.queries = {i: t.clone() for i, t in self._graph_queries[q].items()}
