"""What hf_triforce needs to know about transformers' logits processors (called per position, with that position's
own context; classes are matched exactly: a subclass may read ``input_ids``)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import transformers
from transformers import LogitsProcessorList

_CONTEXT_FREE_NAMES = (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper", "SuppressTokensLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "LogitNormalization",
)  # fmt: skip
CONTEXT_FREE = tuple(getattr(transformers, n) for n in _CONTEXT_FREE_NAMES if hasattr(transformers, n))
"""Processor classes whose ``__call__`` ignores ``input_ids`` (checked for each supported transformers)."""


def context_free_tail(logits_processor: LogitsProcessorList) -> int:
    """How many processors at the end of ``logits_processor`` ignore ``input_ids`` (they may run on all positions)."""
    tail = 0
    for processor in reversed(logits_processor):
        if type(processor) not in CONTEXT_FREE:
            break
        tail += 1
    return tail


def for_row(logits_processor: LogitsProcessorList, index: int) -> LogitsProcessorList:
    """``logits_processor`` for row ``index`` run as a batch of one: a ``PrefixConstrainedLogitsProcessor`` gets the
    row's batch index (as in plain batched ``generate()``); the other processors are shared."""
    return LogitsProcessorList(_rebound(p, index) for p in logits_processor)


def _rebound(processor, index: int):
    """``processor`` for a batch of one, passing ``index // _num_beams`` as the batch index (transformers 5.24 sets
    ``_num_beams`` to ``max(num_beams, num_return_sequences)``, so one prompt's copies share it; 5.17 ``num_beams``)."""
    if type(processor) is not transformers.PrefixConstrainedLogitsProcessor:
        return processor
    fn, batch_index = processor._prefix_allowed_tokens_fn, index // processor._num_beams
    return transformers.PrefixConstrainedLogitsProcessor(lambda _, ids: fn(batch_index, ids), 1)


def answer_repetition_penalty(penalty: float, prompt_length: int) -> dict[str, Any]:
    """``generate()`` kwargs for a repetition penalty on the answer's own tokens (the prompt's tokens are free).

    ``repetition_penalty`` is passed too so that the processor replaces the built-in one in place (before the
    warpers); :func:`custom_processor_replaces_builtin` keeps transformers' note about that out of the log."""
    processor = transformers.RepetitionPenaltyLogitsProcessor(float(penalty), prompt_ignore_length=prompt_length)
    return {"repetition_penalty": float(penalty), "logits_processor": LogitsProcessorList([processor])}


class _Replaced(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "will take precedence" not in record.getMessage()


@contextlib.contextmanager
def custom_processor_replaces_builtin():
    """Within the block, transformers' warning that a custom processor replaces a built-in one is dropped."""
    log, quiet = logging.getLogger("transformers.generation.utils"), _Replaced()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)
