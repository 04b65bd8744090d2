"""The end-to-end benchmark: plain ``generate()`` vs TriForce on a real model and a long document
(``hf-triforce bench``)."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import TriForceConfig
from ..hf.model import attn_implementation, context_limit
from ..hf.processors import answer_repetition_penalty, custom_processor_replaces_builtin
from .backend import preferred_attn_implementation
from .comparison import Comparison, compare
from .documents import DEFAULT_QUESTION, DocumentError, DocumentQuestion, question_prompt
from .generate_kwargs import generate_kwargs
from .loading import load_model
from .machine import machine_info
from .options import DEFAULT_PLAIN
from .prefix import Prefix
from .prompt_set import BENCH_PROMPTS, BenchPrompt, prompt_record, user_prompt
from .prompt_set import bench_prompt as bench_prompt_named
from .repetition import DEFAULT_REPETITION_PENALTY, loops, repeated_fraction
from .summary import summarize

logger = logging.getLogger(__name__)


@dataclass
class BenchOptions(DocumentQuestion):
    """A sweep: every combination of prompt, prompt length, temperature, budget, drafter and tree budget is measured.

    By default the prompts are the seven documents and questions of
    :data:`~hf_triforce.bench.prompt_set.BENCH_PROMPTS` (one per genre); a ``document`` or a
    ``question`` of the user's replaces them with that one prompt (the question defaulting to the demo's).
    Every row times the plain decodings of ``plain`` (the fastest is "best plain") beside TriForce, each from a
    copy of the prompt's one prefill on the CPU (:mod:`.prefix`), with the demo's penalty on the answer's own
    repetitions (``repetition_penalty``; None or 1.0 for none) given to every run alike.
    """

    question: str | None = None
    prompts: list[str] | None = None  # names from BENCH_PROMPTS (None: all of them)
    plain: list[str] = field(default_factory=lambda: list(DEFAULT_PLAIN))
    repetition_penalty: float | None = DEFAULT_REPETITION_PENALTY

    prompt_tokens: list[int] = field(default_factory=lambda: [7000])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6])
    budgets: list[int] = field(default_factory=lambda: [TriForceConfig.retrieval_budget])  # the config's defaults
    drafters: list[str] = field(default_factory=lambda: [TriForceConfig.drafter])
    tree_budgets: list[int | str] = field(default_factory=lambda: ["auto"])  # TriForceConfig.tree_budget, each a row
    new_tokens: int = 128
    top_p: float = 0.9
    gamma1: int | None = None
    gamma2: int | None = None
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    prefill_chunk_size: int | None = None
    rescore_candidates: int | None = None  # TriForceConfig.rescore_candidates (None: the config's default)
    level1_weights: str | None = None  # TriForceConfig.level1_weights (None: the config's default)
    offload_kv: bool = False  # TriForceConfig.offload_kv
    attn_implementation: str = "auto"
    cuda_graphs: bool | str = TriForceConfig.cuda_graphs
    prompt_lookup: int | None = None
    adaptive: bool = True


def run_benchmark(options: BenchOptions, command: str = "") -> dict[str, Any]:
    """Measure every combination of ``options``; returns ``{"title", "command", "machine", "rows", "summary"}``.

    Each row compares plain ``generate()`` and TriForce on the same prompt in this process (prefill
    excluded, warm-up done). Both are forced to produce exactly ``new_tokens`` tokens
    (``min_new_tokens``), so an early end-of-sequence cannot skew the per-token figures.

    Example:
        >>> run_benchmark(BenchOptions(prompt_tokens=[7000], temperatures=[0.0]))  # doctest: +SKIP
    """
    prompts = bench_prompts(options)
    model, tokenizer = load_bench_model(options)
    limit = context_limit(model)
    rows = []
    for prompt, tokens in tqdm(list(itertools.product(prompts, options.prompt_tokens)), desc="prompts"):
        ids = question_prompt(tokenizer, prompt.text(), prompt.question, tokens, limit, options.new_tokens)
        ids = ids.to(model.device)
        prefix = bench_prefix(options, model, ids)
        sweep = itertools.product(options.temperatures, options.budgets, options.drafters, options.tree_budgets)
        for temperature, budget, drafter, tree_budget in sweep:
            row, comparison = measure_row(options, model, None, ids, prefix, temperature, budget, drafter, tree_budget)
            rows.append({**row, **answer_facts(prompt, row, comparison, prefix)})
    return bench_results(rows, command)


def bench_results(rows: list[dict[str, Any]], command: str) -> dict[str, Any]:
    """The benchmark's results around its ``rows``: the machine and the medians over prompts."""
    results = {"title": "plain generate() vs TriForce", "command": command, "machine": machine_info(), "rows": rows}
    results["summary"] = summarize(rows)
    return results


def measure_row(
    options: BenchOptions, model, assistant, ids, prefix, temperature, budget, drafter, tree_budget="auto", **compare_kw
) -> tuple[dict[str, Any], Comparison]:
    """One comparison (plain decodings, TriForce, prompt lookup) on ``ids``: its JSON-ready row and the comparison.

    ``compare_kw`` overrides :func:`~.comparison.compare`'s arguments (e.g. ``plain_decodings=()``)."""
    config = bench_config(options, budget, drafter, tree_budget)
    kwargs = row_generate_kwargs(options, temperature, ids.shape[1])
    extra = {"assistant_model": assistant} if assistant is not None and drafter in ("auto", "model") else {}
    arguments = dict(seed=options.seed, plain_prefill_chunk_size=options.prefill_chunk_size, prefix=prefix,
                     plain_decodings=options.plain, prompt_lookup_tokens=options.prompt_lookup, **extra)  # fmt: skip
    with custom_processor_replaces_builtin():
        result = compare(model, ids, config, **{**arguments, **compare_kw}, **kwargs)
    row = {"prompt_tokens": ids.shape[1], "temperature": temperature, "budget": budget, "drafter": drafter}
    row["tree_budget"] = tree_budget
    row.update(result.to_dict(), config=config.to_dict(), weight_bytes=weight_bytes(model))
    row["model_config"] = {
        "dtype": str(model.dtype).removeprefix("torch."),
        "attn_implementation": attn_implementation(model),
    }
    logger.info("%s: %.2fx best plain (%s), %.2fx default", ids.shape[1], result.speedup_best_plain,
                result.best_plain, result.speedup)  # fmt: skip
    return row, result


def row_generate_kwargs(options: BenchOptions, temperature: float, prompt_tokens: int) -> dict[str, Any]:
    """``generate()`` arguments of every run of a row: ``new_tokens`` exactly, the temperature, the penalty."""
    kwargs = generate_kwargs(options.new_tokens, temperature, options.top_p, min_new_tokens=options.new_tokens)
    if options.repetition_penalty not in (None, 1.0):
        kwargs.update(answer_repetition_penalty(options.repetition_penalty, prompt_tokens))
    return kwargs


def bench_prefix(options: BenchOptions, model, ids: torch.LongTensor) -> Prefix | None:
    """The prompt prefilled once for every call of its rows on the CPU, where a 7K prefill costs ~45 s; on a GPU
    (where copies of a 128K cache would not fit beside the model), fresh calls."""
    if model.device.type != "cpu":
        return None
    return Prefix(model, ids, options.new_tokens, chunk_size=options.prefill_chunk_size)


def answer_facts(
    prompt: BenchPrompt | None, row: dict[str, Any], comparison: Comparison, prefix: Prefix | None
) -> dict[str, Any]:
    """Which prompt a row asked, whether its answer loops (then it is left out of every summary), the prefill."""
    answers = [run.sequences[0, row["prompt_tokens"] :].tolist() for run in (comparison.plain, comparison.triforce)]
    facts: dict[str, Any] = {"prompt": None if prompt is None else prompt_record(prompt)}
    if prompt is not None:  # sampled, the two answers differ: the row loops if either does
        facts["answer_repeated_fraction"] = max(repeated_fraction(a) for a in answers)
        facts["loops"] = any(loops(a) for a in answers)
    if prefix is not None:
        facts["prefix_prefill_seconds"] = dict(prefix.prefill_seconds)
    return facts


def bench_config(options: BenchOptions, budget: int, drafter: str, tree_budget: int | str = "auto") -> TriForceConfig:
    """The ``TriForceConfig`` of one row of the sweep.

    Example:
        >>> bench_config(BenchOptions(gamma2=4), 512, "ngram").gamma2
        4
    """
    names = ("gamma1", "gamma2", "prefill_chunk_size", "rescore_candidates", "level1_weights")
    extra = {k: getattr(options, k) for k in names if getattr(options, k) is not None}
    return TriForceConfig(
        retrieval_budget=budget, drafter=drafter, cuda_graphs=options.cuda_graphs, adaptive=options.adaptive,
        offload_kv=options.offload_kv, tree_budget=tree_budget, **extra,
    )  # fmt: skip


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (tied weights counted once): what every forward reads."""
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


def load_bench_model(options: BenchOptions):
    """``(model, tokenizer)`` as ``hf-triforce bench`` loads them: on the requested device and dtype, with the
    attention implementation ``options`` asks for.

    Example:
        >>> model, tokenizer = load_bench_model(BenchOptions())  # doctest: +SKIP
    """
    attn = preferred_attn_implementation(options.device or "cpu", options.attn_implementation)
    logger.info("attention implementation: %s", attn)
    model, tokenizer = load_model(options.model, attn)
    dtype = getattr(torch, options.dtype) if options.dtype else None
    return model.to(device=options.device or "cpu", dtype=dtype), tokenizer


def bench_prompts(options: BenchOptions) -> list[BenchPrompt]:
    """The prompts ``options`` asks for: :data:`~hf_triforce.bench.prompt_set.BENCH_PROMPTS` (or those
    named by ``options.prompts``), or one prompt of the user's ``document``/``question``.

    Raises:
        DocumentError: an unknown prompt name, or a user's document that cannot be read (before any model work).

    Example:
        >>> [p.name for p in bench_prompts(BenchOptions(prompts=["code", "table"]))]
        ['code', 'table']
    """
    if options.document is not None or options.question is not None:
        if options.prompts is not None:
            raise DocumentError(
                "--prompts chooses among the bench's own documents: drop it with --document/--question."
            )
        return [user_prompt(options.document, options.question or DEFAULT_QUESTION)]
    names = options.prompts or [p.name for p in BENCH_PROMPTS]
    return [bench_prompt_named(name) for name in names]
