"""Level-0 drafter: a tiny causal LM with a StreamingLLM cache."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..caches.static_streaming import use_static_layers
from ..caches.streaming import StreamingLLMCache
from ..hf.versions import cache_kwargs
from ..sampling import draw
from .drafter import common_prefix_length
from .static_steps import StaticStepRunner


class ModelDrafter:
    """A :class:`~hf_triforce.hierarchy.drafter.Drafter`: a small model sharing the target's vocabulary, through the
    call's logits processors, over a StreamingLLM cache (sinks and a recent window). Each proposal rolls the cache
    back to the common prefix of what it consumed and the sequence, then consumes the new tokens.

    Args:
        model: any transformers causal LM with rotary embeddings.
        do_sample: sample drafts (returning their distributions) or take the argmax.

    Example:
        >>> drafter = ModelDrafter(tiny_model, cache, LogitsProcessorList(), do_sample=False)  # doctest: +SKIP
        >>> tokens, probs = drafter.propose(prefix_ids, k=2)  # doctest: +SKIP
    """

    def __init__(self, model, cache: StreamingLLMCache, logits_processor: LogitsProcessorList, do_sample: bool):
        self.model, self.cache = model, cache
        self.logits_processor, self.do_sample = logits_processor, do_sample
        self.consumed = torch.empty(0, dtype=torch.long, device=model.device)
        self.forwards = 0
        self.runner = None

    def use_static_steps(self, mode: str, strict: bool = False) -> None:
        """Run the draft forwards on fixed-capacity storage, ``mode`` ``"eager"`` or ``"graphs"`` (``"dynamic"``: no
        change); ``strict``: a failed capture raises. Call before the first proposal (the cache must be empty)."""
        if mode == "dynamic":
            return
        use_static_layers(self.cache)
        self.runner = StaticStepRunner(
            self.model, self.cache, (1,), use_graphs=mode == "graphs", logits_to_keep=1, strict=strict
        )

    def propose(self, prefix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``k`` tokens after ``prefix`` (``[n]``); returns ``([k] tokens, [k, V] probs or None)``."""
        scores = self._catch_up(prefix)
        tokens, probs = [], []
        for i in range(k):
            ids = torch.cat([prefix, prefix.new_tensor(tokens)])
            processed = self.logits_processor(ids[None], scores[None].float())[0]
            p = processed.softmax(dim=-1) if self.do_sample else None
            token = draw(p) if self.do_sample else int(processed.argmax())
            tokens.append(token)
            probs.append(p)
            if i + 1 < k:
                scores = self._forward(prefix.new_tensor([token]))
        return prefix.new_tensor(tokens), (torch.stack(probs) if self.do_sample else None)

    def reset(self) -> None:
        """Empty the draft cache: the next proposal starts over from its prefix."""
        self.cache.crop(-self.cache.get_seq_length())
        self.consumed = self.consumed[:0]

    def _catch_up(self, prefix: torch.Tensor) -> torch.Tensor:
        common = min(common_prefix_length(self.consumed, prefix), prefix.shape[0] - 1)
        rollback = self.consumed.shape[0] - common
        if common <= 0 or rollback > self.cache.get_seq_length() - self.cache.sinks:
            return self._restart(prefix)
        self.cache.crop(-rollback)
        self.consumed = self.consumed[:common]
        return self._forward(prefix[common:])

    def _restart(self, prefix: torch.Tensor) -> torch.Tensor:
        """Start over from the sinks and the most recent window of ``prefix``."""
        self.cache.crop(-self.cache.get_seq_length())
        self.consumed = prefix[:0]
        window = self.cache.budget - self.cache.sinks - self.cache.evict_batch
        if prefix.shape[0] > self.cache.sinks + window:
            if self.cache.sinks:
                self._forward(prefix[: self.cache.sinks])
            self.consumed = prefix[: prefix.shape[0] - window]
            prefix = prefix[prefix.shape[0] - window :]
        return self._forward(prefix)

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Consume ``tokens`` (``[n]``, in pieces that fit beside the sinks); logits ``[V]`` after the last."""
        piece = self.cache.budget - self.cache.sinks
        for start in range(0, tokens.shape[0], piece):
            part = tokens[start : start + piece]
            self.cache.make_room(part.shape[0])
            if self.runner is not None:  # StreamingLLM: a token's position is its cache slot
                logits = self.runner.step(part, self.cache.get_seq_length())[-1]
            else:
                out = self.model(input_ids=part[None], use_cache=True, logits_to_keep=1, **cache_kwargs(self.cache))
                logits = out.logits[0, -1].float()
            self.consumed = torch.cat([self.consumed, part])
            self.forwards += 1
        return logits
