"""``hf-triforce eval-drafts``: draft quality on real long context, level by level.

What is measured (all against the full-cache model, which is what every level is verified against):

* **Level 1 (the sparse view)**: for natural continuations of the document and for needle tasks (a
  distinctive passage at a chosen depth that the answer must copy), the per-position acceptance of the
  retrieval view and of a StreamingLLM view of the same budget, at several budgets (fractions of the
  context) and temperatures. See :mod:`~hf_triforce.evaluation.drafts.level1` and
  :mod:`~hf_triforce.evaluation.drafts.acceptance`: argmax agreement at ``T = 0``, the exact
  speculative-sampling acceptance ``sum_x min(p, p_hat)`` at ``T > 0``; no generation per cell, one
  reference continuation per (prompt, temperature).
* **Selection policy ablations** at the headline budget, one knob at a time from the ``TriForceConfig``
  defaults: how a GQA group's queries are combined, the recent window, the chunk size, the refresh
  stride and the refresh on falling acceptance.
* **Level 0**: n-gram lookup and truncated-layer copies of the target (StreamingLLM cache) proposing
  against level 1's distribution along the same references.
* **End to end**: ``model.generate(..., triforce_config=...)`` with each level-0 drafter on a shorter
  prompt, with the per-level acceptance from ``hf_triforce.last_stats``.

Example:
    >>> results = run_eval_drafts(EvalOptions(context_tokens=4096, new_tokens=64))  # doctest: +SKIP
    >>> write_eval_results(results, "benchmarks/results/eval-drafts.json")  # doctest: +SKIP

The modules: :mod:`.options` (what is measured), :mod:`.tasks` and :mod:`.needle` (the prompts),
:mod:`.reference` (the full-cache continuations), :mod:`.plan`, :mod:`.view_policy`, :mod:`.level1` and
:mod:`.view_forward` (level 1), :mod:`.level0` (level 0), :mod:`.end_to_end`, :mod:`.acceptance` (the
measure), :mod:`.summary` and :mod:`.report` (pooled figures and the markdown report).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import asdict
from typing import Any

import torch
from tqdm.auto import tqdm

from ...config import TriForceConfig
from ...hf.model import context_limit, eos_token_ids, num_layers, truncated_model
from ...hierarchy import NGramDrafter
from ..common.documents import read_document
from ..common.loading import load_model
from ..common.machine import machine_info
from .end_to_end import run_end_to_end
from .level0 import measure_drafter, model_drafter
from .level1 import measure_view
from .needle import needle_coverage, needle_overlap
from .options import EvalOptions, EvalOptionsError
from .plan import default_policy, policy_plan
from .reference import Reference, decode_reference, prefill_prompt
from .tasks import Task, build_tasks, task_record
from .view_policy import NEVER, ViewPolicy

logger = logging.getLogger(__name__)


def run_eval_drafts(options: EvalOptions, command: str = "") -> dict[str, Any]:
    """Run the whole evaluation; returns the JSON-ready results (see :mod:`~hf_triforce.evaluation.drafts.report`).

    Example:
        >>> run_eval_drafts(EvalOptions(needle_depths=[0.5], temperatures=[0.0]))  # doctest: +SKIP
    """
    start = time.perf_counter()
    model, tokenizer = load_model(options.model)
    document = read_document(options.document)
    _check_context(model, options)
    tasks = build_tasks(tokenizer, document, options, options.context_tokens - options.new_tokens)
    drafts = {f"model-{k}L": truncated_model(model, k) for k in options.draft_layers if k > 0}
    results: dict[str, Any] = {
        "title": "Draft quality on real long context (hf-triforce eval-drafts)",
        "command": command,
        "model_name": options.model or "SmolLM2-135M-Instruct (embedded)",
        "num_layers": num_layers(model),
        "machine": machine_info(),
        "options": asdict(options),
        "config_defaults": TriForceConfig().to_dict(),
        "tasks": [task_record(t) for t in tasks],
        "references": [],
        "views": [],
        "level0": [],
        "end_to_end": [],
    }
    grid = list(itertools.product(tasks, options.temperatures))
    bar = tqdm(total=len(grid), desc="eval-drafts", unit="continuation")
    for task in tasks:
        _measure_task(model, tokenizer, task, options, drafts, results, bar)
    bar.close()
    if options.end_to_end:
        results["end_to_end"] = run_end_to_end(model, tokenizer, document, options, drafts)
    results["seconds"] = time.perf_counter() - start
    return results


def _measure_task(model, tokenizer, task: Task, options: EvalOptions, drafts, results: dict, bar) -> None:
    n = task.prompt.shape[1]
    bar.set_postfix_str(f"{task.name}: prefill {n} tokens")
    cache, prefill = prefill_prompt(model, task.prompt, capacity=n + options.new_tokens + 8)
    eos = eos_token_ids(model.generation_config)
    for temperature in options.temperatures:
        bar.set_postfix_str(f"{task.name} T={temperature:g}")
        generator = torch.Generator().manual_seed(options.seed + len(results["references"]))
        ref = decode_reference(model, cache, prefill, options.new_tokens, temperature, options.top_p, generator, eos)
        results["references"].append(_reference_record(task, ref, tokenizer))
        headline_logits = _measure_views(model, cache, task, ref, options, results)
        _measure_level0(task, ref, headline_logits, options, drafts, results)
        cache.crop(-(ref.tokens.shape[0] - 1))
        bar.update(1)


def _measure_views(model, cache, task: Task, ref: Reference, options: EvalOptions, results: dict) -> torch.Tensor:
    """Main grid (every budget, retrieval and streaming) and the ablations; returns headline level-1 logits."""
    done: dict[ViewPolicy, Any] = {}
    headline = default_policy(options.budget(options.headline_fraction))
    for group, knob, value, fraction, policy in policy_plan(options):
        if policy not in done:
            keep = policy == headline
            gamma2 = TriForceConfig().gamma2
            done[policy] = measure_view(
                model, cache, ref, policy, options.top_p, gamma2, keep, options.max_rows, options.seed
            )
        m = done[policy]
        row = {
            "task": task.name,
            "task_kind": task.kind,
            "depth": task.info.get("depth"),
            "passage_kind": task.info.get("passage_kind"),
            "haystack": task.info.get("haystack"),
            "temperature": ref.temperature,
            "group": group,
            "knob": knob,
            "value": _jsonable(value),
            "budget_fraction": fraction,
            "budget": policy.budget,
            "kind": policy.kind,
            "label": policy.label,
            "policy": policy.to_dict(),
            "acceptance": m.mean,
            "accepted_sum": float(m.acceptance.sum()),
            "positions": m.acceptance.numel(),
            "refreshes": m.refreshes,
            "view_tokens": m.view_tokens,
            "round_accepted": m.accepted,
            "round_drafted": m.drafted,
            "round_rejections": m.rejections,
            "per_token": m.per_token,
        }
        results["views"].append(row)
    return done[headline].logits


def _measure_level0(task: Task, ref: Reference, level1_logits, options: EvalOptions, drafts, results) -> None:
    config = TriForceConfig()
    drafters = {"none": None, "ngram": NGramDrafter(config.ngram_max, config.ngram_min)}
    drafters.update({name: model_drafter(d, config, ref.temperature, options.top_p) for name, d in drafts.items()})
    for name, drafter in drafters.items():
        m = measure_drafter(drafter, ref, level1_logits, options.top_p, options.seed)
        results["level0"].append(
            {
                "task": task.name,
                "task_kind": task.kind,
                "depth": task.info.get("depth"),
                "temperature": ref.temperature,
                "drafter": name,
                "coverage": m.coverage,
                "acceptance": m.acceptance,
                "proposals": m.proposals,
                "positions": m.positions,
            }
        )


def _reference_record(task: Task, ref: Reference, tokenizer) -> dict[str, Any]:
    record = {
        "task": task.name,
        "task_kind": task.kind,
        "temperature": ref.temperature,
        "prompt_tokens": ref.prompt_length,
        "new_tokens": ref.tokens.shape[0],
        "text": tokenizer.decode(ref.tokens),
    }
    if task.needle is not None:
        record["needle_overlap"] = needle_overlap(ref.tokens, task.needle.needle_ids)
        record["needle_coverage"] = needle_coverage(ref.tokens, task.needle.needle_ids)
    return record


def _check_context(model, options: EvalOptions) -> None:
    limit = context_limit(model)
    checked = [("--context-tokens", options.context_tokens)]
    if options.end_to_end:  # --no-end-to-end: the end-to-end context is never used
        checked.append(("--e2e-context-tokens", options.e2e_context_tokens))
    for name, tokens in checked:
        if limit is not None and tokens > limit:
            raise EvalOptionsError(f"{name} {tokens} exceeds the model's context of {limit} tokens; lower it.")
    if options.context_tokens <= options.new_tokens + 64:
        raise EvalOptionsError("--context-tokens must exceed --new-tokens by more than 64 (room for the prompt).")


def _jsonable(value: Any) -> Any:
    return None if value == NEVER else value
