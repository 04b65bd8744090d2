"""What hf_triforce needs to know about transformers' logits processors.

TriForce judges several positions, and in a batch several rows, per forward. ``generate()`` calls its
processors once per step on ``[B, V]`` scores with the ``[B, n]`` tokens so far; TriForce calls them per position
with that position's own context, which is exact for any processor that is a function of ``(input_ids, scores)``
row by row. Two facts about the classes themselves let it do better and stay exact:

* the **context-free** warpers (temperature, top-k, top-p, min-p, typical, epsilon, eta, top-h, suppressed
  tokens, ...) never read ``input_ids``: the trailing run of them in a processor list can process every position
  of every row in one call (one sort of ``[positions, V]`` instead of one per position);
* :class:`~transformers.PrefixConstrainedLogitsProcessor` passes the **batch index** to the user's
  ``prefix_allowed_tokens_fn``: a row processed on its own must be given its own index.

Classes are matched exactly (``type(p) is cls``): a subclass may read ``input_ids`` and is processed per position.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import transformers
from transformers import LogitsProcessorList

_CONTEXT_FREE_NAMES = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "TopHLogitsWarper",
    "SuppressTokensLogitsProcessor",
    "InfNanRemoveLogitsProcessor",
    "LogitNormalization",
)
CONTEXT_FREE = tuple(getattr(transformers, n) for n in _CONTEXT_FREE_NAMES if hasattr(transformers, n))
"""The processor classes whose ``__call__`` ignores ``input_ids`` (checked for each supported transformers)."""


def context_free_tail(logits_processor: LogitsProcessorList) -> int:
    """How many processors at the end of ``logits_processor`` ignore ``input_ids`` (they may run on every
    position of every row at once).

    Example:
        >>> from transformers import TemperatureLogitsWarper, TopPLogitsWarper, RepetitionPenaltyLogitsProcessor
        >>> context_free_tail(LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2),
        ...                                         TemperatureLogitsWarper(0.6), TopPLogitsWarper(0.9)]))
        2
    """
    tail = 0
    for processor in reversed(logits_processor):
        if type(processor) not in CONTEXT_FREE:
            break
        tail += 1
    return tail


def for_row(logits_processor: LogitsProcessorList, index: int) -> LogitsProcessorList:
    """``logits_processor`` for row ``index`` of a batch processed as a batch of one: a
    :class:`~transformers.PrefixConstrainedLogitsProcessor` is given that row's batch index (the one plain batched
    ``generate()`` gives it); every other processor is shared.

    Example:
        >>> import torch
        >>> from transformers import PrefixConstrainedLogitsProcessor
        >>> seen = []
        >>> row = for_row(LogitsProcessorList([PrefixConstrainedLogitsProcessor(
        ...     lambda b, ids: seen.append(b) or [0], num_beams=1)]), 3)
        >>> _ = row(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 4)); seen
        [3]
    """
    return LogitsProcessorList(_rebound(p, index) for p in logits_processor)


def _rebound(processor, index: int):
    """A ``PrefixConstrainedLogitsProcessor`` for a batch of one that passes row ``index``'s batch index: ``index //
    num_beams`` as the processor counts it (transformers 5.24 builds it with ``max(num_beams,
    num_return_sequences)``, so the copies of one prompt share its index; 5.17 with ``num_beams``)."""
    if type(processor) is not transformers.PrefixConstrainedLogitsProcessor:
        return processor
    fn, batch_index = processor._prefix_allowed_tokens_fn, index // processor._num_beams
    return transformers.PrefixConstrainedLogitsProcessor(lambda _, ids: fn(batch_index, ids), 1)


def answer_repetition_penalty(penalty: float, prompt_length: int) -> dict[str, Any]:
    """``generate()`` kwargs for a repetition penalty on the answer's own tokens (the prompt's tokens are free).

    ``generate(repetition_penalty=p)`` also penalizes every token of the prompt, so a long document makes its
    common words unlikely and copying from it hard. transformers' documented remedy is a
    ``RepetitionPenaltyLogitsProcessor(p, prompt_ignore_length=n)`` passed as ``logits_processor``; passing
    ``repetition_penalty`` as well puts it where generate() puts its own (before temperature, top-k and top-p),
    because a custom processor replaces the built-in one of the same class in place. Use the kwargs inside
    :func:`custom_processor_replaces_builtin` to keep transformers' note about that replacement out of the log.

    Args:
        penalty: the penalty (> 0; 1.0 means none).
        prompt_length: tokens of the prompt, ``input_ids.shape[1]``.

    Example:
        >>> kwargs = answer_repetition_penalty(1.2, prompt_length=7000)
        >>> kwargs["repetition_penalty"], kwargs["logits_processor"][0].prompt_ignore_length
        (1.2, 7000)
    """
    processor = transformers.RepetitionPenaltyLogitsProcessor(float(penalty), prompt_ignore_length=prompt_length)
    return {"repetition_penalty": float(penalty), "logits_processor": LogitsProcessorList([processor])}


class _Replaced(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "will take precedence" not in record.getMessage()


@contextlib.contextmanager
def custom_processor_replaces_builtin():
    """Within the block, transformers' warning that a custom logits processor replaces the built-in one of the
    same class is dropped (it is the intent of :func:`answer_repetition_penalty`); every other record passes.

    Example:
        >>> with custom_processor_replaces_builtin():
        ...     pass
    """
    log, quiet = logging.getLogger("transformers.generation.utils"), _Replaced()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)
