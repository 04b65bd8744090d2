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
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ...config import TriForceConfig
from ...errors import TriForceConfigError
from ...hf.model import eos_token_ids, truncated_model
from ...hierarchy import NGramDrafter
from ..bench.report import machine_info
from ..common.documents import DocumentError, read_document
from .level0 import measure_drafter, model_drafter
from .level1 import measure_view
from .needle import NeedlePrompt, build_needle_prompt, needle_coverage, needle_overlap
from .reference import Reference, decode_reference, prefill_prompt
from .view_policy import NEVER, ViewPolicy

logger = logging.getLogger(__name__)

# knob -> values tried at the headline budget; every other knob keeps its TriForceConfig default.
ABLATIONS: dict[str, list[Any]] = {
    "combine": ["sum", "max", "softmax"],
    "recent_window": [0, 16, 64, 128, 256],
    "chunk_size": [4, 8, 16, 32],
    "refresh_every": [1, 4, 8, 16, 32, NEVER],
    "refresh_below": [None, 0.5, 0.8],
}


class EvalOptionsError(TriForceConfigError):
    """Evaluation options that cannot be run; the message says what to change."""


@dataclass
class EvalOptions:
    """What ``hf-triforce eval-drafts`` measures; the CLI fills it from its arguments."""

    model: str | None = None
    document: str | None = None
    context_tokens: int = 4096
    new_tokens: int = 64
    budget_fractions: list[float] = field(default_factory=lambda: [1 / 16, 1 / 8, 1 / 4])
    headline_fraction: float = 1 / 8
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6, 1.0])
    top_p: float = 1.0
    natural_prompts: int = 3
    needle_depths: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    ablations: bool = True
    draft_layers: list[int] = field(default_factory=lambda: [4])
    streaming_sinks: int = 8
    end_to_end: bool = True
    e2e_context_tokens: int = 2048
    e2e_new_tokens: int = 64
    seed: int = 0
    max_rows: int = 32

    def __post_init__(self) -> None:
        if self.new_tokens < 2:
            raise EvalOptionsError(
                f"--new-tokens must be at least 2 (level 1 drafts from the second), got {self.new_tokens}."
            )
        if not self.budget_fractions or any(not 0 < f <= 1 for f in self.budget_fractions):
            raise EvalOptionsError(f"budget fractions must be in (0, 1], got {self.budget_fractions}.")
        if self.headline_fraction not in self.budget_fractions:
            raise EvalOptionsError(
                f"the headline budget fraction {self.headline_fraction:g} must be one of --budgets "
                f"{[round(f, 4) for f in self.budget_fractions]}."
            )
        if any(t < 0 for t in self.temperatures) or not self.temperatures:
            raise EvalOptionsError(f"temperatures must be >= 0, got {self.temperatures}.")
        if not 0 < self.top_p <= 1:
            raise EvalOptionsError(f"--top-p must be in (0, 1], got {self.top_p}.")
        if self.natural_prompts < 0 or any(not 0 <= d <= 1 for d in self.needle_depths):
            raise EvalOptionsError("--natural-prompts must be >= 0 and needle depths in [0, 1].")
        if self.natural_prompts == 0 and not self.needle_depths:
            raise EvalOptionsError("nothing to measure: pass --natural-prompts > 0 or some --needle-depths.")

    def budget(self, fraction: float, context: int | None = None, chunk_size: int = 8) -> int:
        """``fraction`` of the context in tokens, rounded down to whole chunks (at least the smallest valid).

        Example:
            >>> EvalOptions().budget(1 / 8)
            512
        """
        minimum = TriForceConfig(chunk_size=chunk_size).min_retrieval_budget
        tokens = int(fraction * (context or self.context_tokens)) // chunk_size * chunk_size
        return max(minimum, tokens)


@dataclass
class Task:
    """One prompt of the evaluation: a natural continuation of the document or a needle task."""

    name: str
    kind: str
    prompt: torch.LongTensor
    info: dict[str, Any]
    needle: NeedlePrompt | None = None


def run_eval_drafts(options: EvalOptions, command: str = "") -> dict[str, Any]:
    """Run the whole evaluation; returns the JSON-ready results (see :mod:`~hf_triforce.evaluation.drafts.report`).

    Example:
        >>> run_eval_drafts(EvalOptions(needle_depths=[0.5], temperatures=[0.0]))  # doctest: +SKIP
    """
    from ..common.loading import load_model

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
        "num_layers": model.config.get_text_config().num_hidden_layers,
        "machine": machine_info(),
        "options": asdict(options),
        "config_defaults": TriForceConfig().to_dict(),
        "tasks": [_task_record(t) for t in tasks],
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


def build_tasks(tokenizer, document: str, options: EvalOptions, prompt_tokens: int) -> list[Task]:
    """Natural-continuation prompts (raw document slices) then needle prompts, each ``<= prompt_tokens``."""
    tasks = [
        natural_task(tokenizer, document, i, options.natural_prompts, prompt_tokens)
        for i in range(options.natural_prompts)
    ]
    for depth in options.needle_depths:
        needle = build_needle_prompt(tokenizer, document, prompt_tokens, depth)
        info = {
            "depth": depth,
            "actual_depth": needle.depth,
            "needle_span": list(needle.needle_span),
            "document_span": list(needle.document_span),
            "cue": needle.cue,
        }
        tasks.append(Task(f"needle@{depth:g}", "needle", needle.input_ids, info, needle))
    return tasks


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
        }
        results["views"].append(row)
    return done[headline].logits


def parse_fractions(text: str) -> list[float]:
    """``"1/16,1/8,0.25"`` -> ``[0.0625, 0.125, 0.25]`` (an empty string gives ``[]``).

    Raises:
        EvalOptionsError: a value that is not a number or ``a/b``.

    Example:
        >>> parse_fractions("1/8, 0.6")
        [0.125, 0.6]
    """
    values = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            numerator, _, denominator = item.partition("/")
            values.append(float(numerator) / float(denominator) if denominator else float(numerator))
        except (ValueError, ZeroDivisionError):
            raise EvalOptionsError(f"{item!r} is not a number or a fraction such as 1/8.") from None
    return values


def default_policy(budget: int) -> ViewPolicy:
    """The retrieval policy of ``TriForceConfig()``'s defaults at ``budget``."""
    return ViewPolicy.from_config(TriForceConfig(), budget=budget)


def policy_plan(options: EvalOptions) -> list[tuple[str, str | None, Any, float, ViewPolicy]]:
    """``(group, knob, value, budget fraction, policy)`` rows: the main grid, then the ablations."""
    plan = []
    for fraction in options.budget_fractions:
        budget = options.budget(fraction)
        plan.append(("main", None, None, fraction, default_policy(budget)))
        streaming = ViewPolicy(kind="streaming", budget=budget, sinks=options.streaming_sinks)  # same refreshes
        plan.append(("main", None, None, fraction, streaming))
    if not options.ablations:
        return plan
    fraction = options.headline_fraction
    base = default_policy(options.budget(fraction))
    for knob, values in ABLATIONS.items():
        for value in values:
            try:
                plan.append(("ablation", knob, value, fraction, base.with_(**{knob: value})))
            except TriForceConfigError as err:
                logger.warning("skipping ablation %s=%s: %s", knob, value, err)
    return plan


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


def run_end_to_end(model, tokenizer, document: str, options: EvalOptions, drafts: dict) -> list[dict[str, Any]]:
    """TriForce ``generate()`` with each level-0 drafter on shorter prompts; per-level acceptance per run.

    Prompts: the first natural prompt and the middle needle depth, cut to ``e2e_context_tokens``. The
    retrieval budget is the headline fraction of that context.
    """
    import hf_triforce

    was_enabled = hf_triforce.is_enabled(model)
    hf_triforce.enable(model)
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
            hf_triforce.disable(model)
    return rows


def _generate_row(model, tokenizer, task: Task, temperature: float, drafter: str, draft, budget: int, options):
    import hf_triforce

    config = TriForceConfig(retrieval_budget=budget, drafter="model" if draft is not None else drafter)
    kwargs: dict[str, Any] = {"max_new_tokens": options.e2e_new_tokens, "triforce_config": config}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=options.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False)
    if draft is not None:
        kwargs["assistant_model"] = draft
    torch.manual_seed(options.seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(task.prompt, **kwargs)
    seconds = time.perf_counter() - start
    stats = hf_triforce.last_stats(model).to_dict()
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


def _task_record(task: Task) -> dict[str, Any]:
    return {"name": task.name, "kind": task.kind, "prompt_tokens": task.prompt.shape[1], **task.info}


def _check_context(model, options: EvalOptions) -> None:
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    for name, tokens in (
        ("--context-tokens", options.context_tokens),
        ("--e2e-context-tokens", options.e2e_context_tokens),
    ):
        if limit is not None and tokens > limit:
            raise EvalOptionsError(f"{name} {tokens} exceeds the model's context of {limit} tokens; lower it.")
    if options.context_tokens <= options.new_tokens + 64:
        raise EvalOptionsError("--context-tokens must exceed --new-tokens by more than 64 (room for the prompt).")


def _jsonable(value: Any) -> Any:
    return None if value == NEVER else value
