"""The end-to-end benchmark: plain ``generate()`` vs TriForce on a real model and a long document."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import TriForceConfig
from ..documents import DEFAULT_QUESTION, question_prompt, read_document
from .compare import compare
from .profile import profile_phases
from .report import machine_info

logger = logging.getLogger(__name__)


@dataclass
class BenchOptions:
    """A sweep: every combination of prompt length, temperature, budget and drafter is measured."""

    model: str | None = None
    document: str | None = None
    question: str = DEFAULT_QUESTION
    prompt_tokens: list[int] = field(default_factory=lambda: [7000])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6])
    budgets: list[int] = field(default_factory=lambda: [512])
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    new_tokens: int = 128
    top_p: float = 0.9
    gamma1: int | None = None
    gamma2: int | None = None
    seed: int = 0
    profile: bool = False


def run_benchmark(options: BenchOptions, command: str = "") -> dict[str, Any]:
    """Measure every combination of ``options``; returns ``{"title", "command", "machine", "rows"}``.

    Each row compares plain ``generate()`` and TriForce on the same prompt in this process (prefill
    excluded, warm-up done). Both are forced to produce exactly ``new_tokens`` tokens
    (``min_new_tokens``), so an early end-of-sequence cannot skew the per-token figures.

    Example:
        >>> run_benchmark(BenchOptions(prompt_tokens=[7000], temperatures=[0.0]))  # doctest: +SKIP
    """
    from ..demo import load_model

    document = read_document(options.document)
    model, tokenizer = load_model(options.model)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    grid = list(itertools.product(options.prompt_tokens, options.temperatures, options.budgets, options.drafters))
    rows, warm = [], False
    for tokens, temperature, budget, drafter in tqdm(grid, desc="benchmark", unit="config"):
        ids = question_prompt(tokenizer, document, options.question, tokens, limit, options.new_tokens)
        config = _config(options, budget, drafter)
        on_cpu = model.device.type == "cpu"
        kwargs = _kwargs(options, temperature)
        result = compare(
            model, ids, config, warmup=not warm, seed=options.seed, reference_fast_linears=on_cpu, **kwargs
        )
        warm = True
        row = {"prompt_tokens": ids.shape[1], "temperature": temperature, "budget": budget, "drafter": drafter}
        row.update(result.to_dict(), config=config.to_dict(), weight_bytes=_weight_bytes(model))
        if options.profile:
            torch.manual_seed(options.seed)
            row["profile"] = profile_phases(model, ids, triforce_config=config, **kwargs)
        logger.info("%s: speedup %.2fx", row, result.speedup)
        rows.append(row)
    return {"title": "plain generate() vs TriForce", "command": command, "machine": machine_info(), "rows": rows}


def _config(options: BenchOptions, budget: int, drafter: str) -> TriForceConfig:
    extra = {k: getattr(options, k) for k in ("gamma1", "gamma2") if getattr(options, k) is not None}
    return TriForceConfig(retrieval_budget=budget, drafter=drafter, **extra)


def _kwargs(options: BenchOptions, temperature: float) -> dict[str, Any]:
    kwargs = dict(max_new_tokens=options.new_tokens, min_new_tokens=options.new_tokens)
    if temperature > 0:
        return dict(kwargs, do_sample=True, temperature=temperature, top_p=options.top_p)
    return dict(kwargs, do_sample=False)


def _weight_bytes(model) -> int:
    """Bytes of the model's parameters (tied weights counted once): what every forward reads."""
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(unique.values())
