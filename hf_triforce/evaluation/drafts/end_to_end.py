"""End to end: TriForce ``generate()`` with each level-0 drafter, per-level acceptance from its statistics.

Example:
    >>> rows = run_end_to_end(model, tokenizer, document, EvalOptions(), drafts={})  # doctest: +SKIP
    >>> rows[0]["stats"]["levels"]["level1"]["acceptance_rate"]  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from ...config import TriForceConfig
from ...generation import disable, enable, is_enabled, last_stats
from ..common.generate_kwargs import generate_kwargs
from .needle import needle_overlap
from .options import EvalOptions
from .tasks import Task, build_tasks


def run_end_to_end(model, tokenizer, document: str, options: EvalOptions, drafts: dict) -> list[dict[str, Any]]:
    """TriForce ``generate()`` with each level-0 drafter on shorter prompts; per-level acceptance per run.

    Prompts: the first natural prompt and the middle needle depth, cut to ``e2e_context_tokens``. The
    retrieval budget is the headline fraction of that context.
    """
    was_enabled = is_enabled(model)
    enable(model)
    context = options.e2e_context_tokens
    prompt_tokens = context - options.e2e_new_tokens
    small = EvalOptions(
        natural_prompts=min(1, options.natural_prompts),
        needle_depths=options.needle_depths[len(options.needle_depths) // 2 :][:1],
        budget_fractions=options.budget_fractions,
        headline_fraction=options.headline_fraction,
    )
    tasks = build_tasks(tokenizer, document, small, prompt_tokens)
    budget = options.budget(options.headline_fraction, context)
    drafter_names = ["none", "ngram", *list(drafts)[:1]]
    grid = list(itertools.product(tasks, options.temperatures, drafter_names))
    rows = []
    try:
        for task, temperature, name in tqdm(grid, desc="end-to-end generate()", unit="run"):
            rows.append(_generate_row(model, tokenizer, task, temperature, name, drafts.get(name), budget, options))
    finally:
        if not was_enabled:
            disable(model)
    return rows


def _generate_row(model, tokenizer, task: Task, temperature: float, drafter: str, draft, budget: int, options):
    config = TriForceConfig(retrieval_budget=budget, drafter="model" if draft is not None else drafter)
    # top_k=0: sample from exactly the temperature + top-p distribution that the references and views use
    kwargs = generate_kwargs(options.e2e_new_tokens, temperature, options.top_p, top_k=0)
    kwargs["triforce_config"] = config
    if draft is not None:
        kwargs["assistant_model"] = draft
    torch.manual_seed(options.seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(task.prompt, **kwargs)
    seconds = time.perf_counter() - start
    stats = last_stats(model).to_dict()
    answer = out[0, task.prompt.shape[1] :]
    row = {
        "task": task.name,
        "task_kind": task.kind,
        "prompt_tokens": task.prompt.shape[1],
        "temperature": temperature,
        "drafter": drafter,
        "budget": budget,
        "seconds": seconds,
        "stats": stats,
        "tokens": answer.tolist(),
        "text": tokenizer.decode(answer),
    }
    if task.needle is not None:
        row["needle_overlap"] = needle_overlap(answer, task.needle.needle_ids)
    return row
