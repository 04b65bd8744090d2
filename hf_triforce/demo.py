"""``make demo``: a real model answers a question about a long document, with and without TriForce."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from transformers import TextStreamer

from .config import TriForceConfig
from .evaluation.bench.comparison import Comparison
from .evaluation.bench.timed_run import measure, peak_rss_bytes
from .evaluation.common.documents import DEFAULT_DOCUMENT_TOKENS, DocumentQuestion, question_prompt, read_document
from .evaluation.common.formatting import acceptance_rate, mib, number
from .evaluation.common.generate_kwargs import generate_kwargs
from .evaluation.common.loading import load_model
from .generation import enable
from .hf.model import context_limit

logger = logging.getLogger(__name__)


@dataclass
class DemoOptions(DocumentQuestion):
    """What the demo runs; the CLI fills it from ``hf-triforce demo`` arguments."""

    document_tokens: int | None = DEFAULT_DOCUMENT_TOKENS
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 0.9
    budget: int = 512
    drafter: str = "ngram"
    seed: int = 0


def run_demo(options: DemoOptions, print_fn=print) -> Comparison:
    """Stream a TriForce answer, run plain ``generate()`` on the same input, print a comparison table.

    Example:
        >>> run_demo(DemoOptions(max_new_tokens=16)).identical  # doctest: +SKIP
        True
    """
    config = TriForceConfig(retrieval_budget=options.budget, drafter=options.drafter)
    document = read_document(options.document)
    model, tokenizer = load_model(options.model)
    enable(model)
    limit = context_limit(model)
    ids = question_prompt(tokenizer, document, options.question, options.document_tokens, limit, options.max_new_tokens)
    kwargs = generate_kwargs(options.max_new_tokens, options.temperature, options.top_p)
    print_fn(f"Prompt: {ids.shape[1]} tokens (document + question). Question: {options.question}\n")
    print_fn("TriForce answer (streamed):")
    fast = measure(model, ids, streamer=TextStreamer(tokenizer, skip_prompt=True), seed=options.seed,
                   triforce_config=config, **kwargs)  # fmt: skip
    print_fn("\nRunning plain generate() on the same input for comparison ...")
    plain = measure(model, ids, seed=options.seed, **kwargs)
    result = Comparison(plain, fast, kwargs)
    print_fn(format_table(result, options, config, tokenizer, ids.shape[1]))
    return result


def format_table(result: Comparison, options: DemoOptions, config: TriForceConfig, tokenizer, prompt: int) -> str:
    """The comparison as a small text table."""
    stats = result.triforce.stats
    level0, level1 = stats["levels"]["level0"], stats["levels"]["level1"]
    rows = [
        ("", "plain generate()", "TriForce"),
        ("new tokens", str(result.plain.new_tokens), str(result.triforce.new_tokens)),
        ("prefill (s)", f"{result.plain.prefill_seconds:.1f}", f"{result.triforce.prefill_seconds:.1f}"),
        ("decode tokens/s", number(result.plain.tokens_per_second, 1), number(result.triforce.tokens_per_second, 1)),
    ]
    width = max(len(r[0]) for r in rows) + 2
    lines = ["", f"{'':{width}}{rows[0][1]:>18}{rows[0][2]:>12}"]
    lines += [f"{name:{width}}{a:>18}{b:>12}" for name, a, b in rows[1:]]
    lines += [
        f"speedup (decode, prefill excluded): {result.speedup:.2f}x",
        f"level-0 ({config.drafter}) -> level-1 acceptance: {_rate(level0)}",
        f"level-1 (retrieval view, budget {config.retrieval_budget}) -> level-2 (full cache) acceptance: "
        f"{_rate(level1)}",
        f"mean tokens per full-cache forward: {stats['mean_accepted_length']:.2f} (plain: 1.00)",
        f"identical text: {_identical(result, options, tokenizer, prompt)}",
        f"KV memory: full cache {mib(stats['full_cache_bytes'])}, retrieval view {mib(stats['view_bytes'])}"
        f" ({config.retrieval_budget}-token budget), draft cache {mib(stats['draft_cache_bytes'])}",
        f"peak process memory (RSS): {mib(peak_rss_bytes())}",
    ]
    return "\n".join(lines)


def _identical(result: Comparison, options: DemoOptions, tokenizer, prompt: int) -> str:
    if options.temperature > 0:
        return "n/a when sampling (same distribution, different draws)"
    texts = [tokenizer.decode(r.sequences[0, prompt:]) for r in (result.plain, result.triforce)]
    return "yes" if result.identical and texts[0] == texts[1] else "NO (please report this as a bug)"


def _rate(level: dict) -> str:
    return acceptance_rate(level, counts=True, none="n/a (nothing drafted)")
