"""Several questions about one document: the shared prefix prefilled once, each question decoded from a copy.

The transformers pattern for a shared prefix (prefill it into a ``DynamicCache``, ``copy.deepcopy`` it per
question, pass the copy as the cache) timed three ways on the same prompts:

* ``"plain"``: plain ``generate()`` on each whole prompt (no reuse: every question pays the whole prefill);
* ``"plain_reuse"``: plain ``generate()`` from a copy of the prefix cache;
* ``"triforce_reuse"``: TriForce from a copy of the same prefix cache.

The prefix is the longest run of tokens every question's prompt starts with (the chat template and the
document), so each prompt is exactly what a single question would be. Both reuse modes count the one
prefix prefill in their end-to-end time.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from ..config import TriForceConfig
from ..hf.versions import cache_kwargs
from ..hierarchy.drafter import common_prefix_length
from .documents import DEFAULT_QUESTION
from .timed_run import RunResult, measure

MODES = ("plain", "plain_reuse", "triforce_reuse")
"""The three ways :func:`ask_questions` answers the questions, in the order they run."""

DEFAULT_QUESTIONS = (
    DEFAULT_QUESTION,
    "Using only the document above: what do the 'async with' and 'async for' statements do?",
    "Using only the document above: what does the assert statement do, and what happens to assertions when "
    "Python runs with optimization (-O)?",
    "Using only the document above: how is an assignment to a target list with a starred target carried out?",
)
"""Four questions that the default document's first 7K tokens answer (the first is the demo's own question)."""


@dataclass
class Answer:
    """One question answered one way.

    Attributes:
        run: the timed ``generate()`` call (its ``prefill_seconds`` is the question's own prefill: the part of
            the prompt after the shared prefix, or the whole prompt without reuse).
        seconds: wall time of the question: copying the prefix cache plus the ``generate()`` call.
    """

    run: RunResult
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready figures."""
        return {**self.run.to_dict(), "end_to_end_seconds": self.seconds}


@dataclass
class QuestionsResult:
    """Every question answered every way (``answers[mode][i]``), and the shared prefix.

    Attributes:
        prompts: ``[1, n_i]`` token ids of each question's whole prompt.
        prefix_tokens: tokens every prompt starts with (prefilled once for the reuse modes).
        prefix_seconds: time of that one prefill.
        answers: mode (:data:`MODES`) -> the questions' answers, in order.
    """

    prompts: list[torch.LongTensor]
    prefix_tokens: int
    prefix_seconds: float
    answers: dict[str, list[Answer]] = field(default_factory=dict)

    def end_to_end_seconds(self, mode: str) -> float:
        """All questions one way, the shared prefill included for the reuse modes."""
        shared = self.prefix_seconds if mode.endswith("_reuse") else 0.0
        return shared + sum(a.seconds for a in self.answers[mode])

    def identical(self, a: str, b: str) -> list[bool]:
        """Per question, whether modes ``a`` and ``b`` generated the same tokens."""
        return [
            torch.equal(x.run.sequences, y.run.sequences) for x, y in zip(self.answers[a], self.answers[b], strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready figures (no token ids)."""
        return {
            "prompt_tokens": [p.shape[1] for p in self.prompts],
            "prefix_tokens": self.prefix_tokens,
            "prefix_seconds": self.prefix_seconds,
            "end_to_end_seconds": {m: self.end_to_end_seconds(m) for m in self.answers},
            "answers": {m: [a.to_dict() for a in answers] for m, answers in self.answers.items()},
        }


def shared_prefix_length(prompts: list[torch.LongTensor]) -> int:
    """Tokens every ``[1, n]`` prompt starts with, at most the shortest prompt minus one.

    Example:
        >>> shared_prefix_length([torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 5]])])
        2
    """
    shortest = min(p.shape[1] for p in prompts) - 1
    return min([shortest, *(common_prefix_length(p[0], prompts[0][0]) for p in prompts[1:])])


def prefill(model, ids: torch.LongTensor) -> tuple[DynamicCache, float]:
    """A ``DynamicCache`` holding ``ids`` ``[1, n]`` (one plain forward), and the seconds it took."""
    cache = DynamicCache(config=model.config)
    start = time.perf_counter()
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True, **cache_kwargs(cache))
    return cache, time.perf_counter() - start


def ask_questions(
    model,
    prompts: list[torch.LongTensor],
    config: TriForceConfig,
    modes=MODES,
    seed: int = 0,
    prompt_kwargs: Callable[[int], dict[str, Any]] | None = None,
    **generate_kwargs,
) -> QuestionsResult:
    """Answer every prompt each way in ``modes`` (see :data:`MODES`), timing each question end to end.

    Args:
        model: an ``hf_triforce.enable``-d model.
        prompts: ``[1, n_i]`` token ids, one prompt per question, sharing a long prefix (the document).
        config: the TriForce configuration of ``"triforce_reuse"``.
        seed: ``torch.manual_seed`` before each call.
        prompt_kwargs: given a prompt's length, more ``generate()`` arguments of that prompt's calls (e.g. a
            processor that must know where the prompt ends).
        generate_kwargs: the ``generate()`` arguments of every call (``max_new_tokens``, ``do_sample``, ...).

    Example:
        >>> result = ask_questions(model, prompts, TriForceConfig(), max_new_tokens=128)  # doctest: +SKIP
        >>> result.end_to_end_seconds("plain_reuse") / result.end_to_end_seconds("triforce_reuse")  # doctest: +SKIP
        1.5
    """
    own = prompt_kwargs or (lambda _: {})
    n = shared_prefix_length(prompts)
    cache, seconds = prefill(model, prompts[0][:, :n])
    result = QuestionsResult(prompts, n, seconds)
    for mode in modes:
        kwargs = dict(generate_kwargs, triforce_config=config) if mode == "triforce_reuse" else generate_kwargs
        result.answers[mode] = [
            _answer(model, ids, cache if mode != "plain" else None, seed, {**kwargs, **own(ids.shape[1])})
            for ids in prompts
        ]
    return result


def _answer(model, ids: torch.LongTensor, prefix: DynamicCache | None, seed: int, kwargs: dict[str, Any]) -> Answer:
    start = time.perf_counter()
    reuse = {} if prefix is None else cache_kwargs(copy.deepcopy(prefix))
    run = measure(model, ids, seed=seed, **reuse, **kwargs)
    return Answer(run, time.perf_counter() - start)
