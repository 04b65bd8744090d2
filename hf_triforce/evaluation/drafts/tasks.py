"""The prompts of the evaluation: natural continuations of the document (raw slices) and needle tasks.

Example:
    >>> tasks = build_tasks(tokenizer, read_document(None), EvalOptions(), prompt_tokens=4032)  # doctest: +SKIP
    >>> [t.name for t in tasks][:2]  # doctest: +SKIP
    ['natural#0', 'natural#1']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..common.documents import DocumentError
from ..common.haystacks import haystack_text
from .copy_tasks import build_copy_prompt, copy_task_specs
from .needle import NeedlePrompt, build_needle_prompt
from .options import EvalOptions


@dataclass
class Task:
    """One prompt of the evaluation: a natural continuation of the document or a needle task."""

    name: str
    kind: str
    prompt: torch.LongTensor
    info: dict[str, Any]
    needle: NeedlePrompt | None = None


def build_tasks(tokenizer, document: str, options: EvalOptions, prompt_tokens: int) -> list[Task]:
    """Natural-continuation prompts (raw slices of the document or of ``options.natural_haystacks``), then needle
    prompts (the document's own passage) or, with ``options.copy_split``, the split's copy tasks; each
    ``<= prompt_tokens``."""
    tasks = natural_tasks(tokenizer, document, options, prompt_tokens)
    if options.copy_split:
        return tasks + copy_tasks(tokenizer, options, prompt_tokens)
    for depth in options.needle_depths:
        needle = build_needle_prompt(tokenizer, document, prompt_tokens, depth)
        tasks.append(Task(f"needle@{depth:g}", "needle", needle.input_ids, _needle_info(depth, needle), needle))
    return tasks


def copy_tasks(tokenizer, options: EvalOptions, prompt_tokens: int) -> list[Task]:
    """The copy tasks of ``options.copy_split``: every passage kind at every needle depth."""
    specs = copy_task_specs(options.copy_split, depths=tuple(options.needle_depths), seed=options.seed)
    texts: dict[str, str] = {}
    tasks = []
    for spec in specs:
        prompt = build_copy_prompt(tokenizer, spec, prompt_tokens, texts)
        info = _needle_info(spec.depth, prompt) | {
            "split": spec.split,
            "passage_kind": spec.kind,
            "haystack": spec.haystack,
            "wording": spec.wording,
            "passage": spec.passage.text,
        }
        tasks.append(Task(spec.name, "copy", prompt.input_ids, info, prompt))
    return tasks


def _needle_info(depth: float, needle: NeedlePrompt) -> dict[str, Any]:
    return {
        "depth": depth,
        "actual_depth": needle.depth,
        "needle_span": list(needle.needle_span),
        "document_span": list(needle.document_span),
        "cue": needle.cue,
    }


def natural_tasks(tokenizer, document: str, options: EvalOptions, prompt_tokens: int) -> list[Task]:
    """``options.natural_prompts`` slices of the document, or that many of each of ``options.natural_haystacks``."""
    count = options.natural_prompts
    if not options.natural_haystacks:
        return [natural_task(tokenizer, document, i, count, prompt_tokens) for i in range(count)]
    tasks = []
    for name in options.natural_haystacks:
        ids = tokenizer(haystack_text(name), add_special_tokens=False).input_ids
        tasks += [haystack_task(ids, name, i, count, prompt_tokens) for i in range(count)]
    return tasks


def haystack_task(ids: list[int], name: str, index: int, count: int, prompt_tokens: int) -> Task:
    """``prompt_tokens`` of the token ids ``ids`` of haystack ``name`` (task ``name#index``, kind ``natural``).

    The possible starts (the first token to the last that leaves ``prompt_tokens``) are cut into ``count`` equal
    parts and slice ``index`` starts in the middle of part ``index``: never at either end, where the benchmarks'
    genre slices (``benchmarks/experiments/step_selection_ab.py``), which took part in choosing the default policy,
    start.

    Raises:
        DocumentError: the haystack is shorter than the prompt.

    Example:
        >>> task = haystack_task(list(range(100)), "code", 1, 4, 20)
        >>> task.name, task.info["start_token"], task.prompt.shape
        ('code#1', 30, torch.Size([1, 20]))
    """
    room = len(ids) - prompt_tokens
    if room < 0:
        raise DocumentError(
            f"the haystack {name!r} has {len(ids)} tokens, fewer than a {prompt_tokens}-token prompt: leave it out "
            "of --natural-haystacks or use a smaller --context-tokens."
        )
    start = room * (2 * index + 1) // (2 * count)
    prompt = torch.tensor([ids[start : start + prompt_tokens]], dtype=torch.long)
    return Task(f"{name}#{index}", "natural", prompt, {"haystack": name, "start_token": start})


def natural_task(tokenizer, document: str, index: int, count: int, prompt_tokens: int) -> Task:
    """``prompt_tokens`` tokens of raw document text starting at line ``index / count`` of the way in.

    Raises:
        DocumentError: the document is too short for the prompt.
    """
    offset = len(document) * index // max(count, 1)
    newline = document.find("\n", offset)
    offset = newline + 1 if 0 <= newline < offset + 2000 else offset
    ids = tokenizer(document[offset : offset + prompt_tokens * 12], add_special_tokens=False).input_ids
    if len(ids) < prompt_tokens:
        raise DocumentError(
            f"the document has fewer than {prompt_tokens} tokens after character {offset}: use a longer document, "
            "fewer --natural-prompts or a smaller --context-tokens."
        )
    prompt = torch.tensor([ids[:prompt_tokens]], dtype=torch.long)
    return Task(f"natural#{index}", "natural", prompt, {"offset_chars": offset})


def task_record(task: Task) -> dict[str, Any]:
    """The JSON-ready description of a task (its prompt length and where its parts are).

    Example:
        >>> task_record(Task("natural#0", "natural", torch.zeros(1, 5, dtype=torch.long), {"offset_chars": 0}))
        {'name': 'natural#0', 'kind': 'natural', 'prompt_tokens': 5, 'offset_chars': 0}
    """
    return {"name": task.name, "kind": task.kind, "prompt_tokens": task.prompt.shape[1], **task.info}
