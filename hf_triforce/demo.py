"""``make demo``: a real model answers a question about a long document, with and without TriForce."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from transformers import TextStreamer

from .config import TriForceConfig
from .evaluation.bench.compare import Comparison, RunResult, measure, peak_rss_bytes
from .evaluation.common.documents import DEFAULT_DOCUMENT_TOKENS, DEFAULT_QUESTION, question_prompt, read_document
from .evaluation.common.loading import load_model

logger = logging.getLogger(__name__)


@dataclass
class DemoOptions:
    """What the demo runs; the CLI fills it from ``hf-triforce demo`` arguments."""

    model: str | None = None
    document: str | None = None
    question: str = DEFAULT_QUESTION
    document_tokens: int | None = DEFAULT_DOCUMENT_TOKENS
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 0.9
    budget: int = 512
    drafter: str = "ngram"
    seed: int = 0


def run_demo(options: DemoOptions, print_fn=print) -> Comparison:
    """Stream a TriForce answer, run plain ``generate()`` on the same input, print a comparison table."""
    import hf_triforce

    config = TriForceConfig(retrieval_budget=options.budget, drafter=options.drafter)
    document = read_document(options.document)
    model, tokenizer = load_model(options.model)
    hf_triforce.enable(model)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    ids = question_prompt(tokenizer, document, options.question, options.document_tokens, limit, options.max_new_tokens)
    kwargs = _generate_kwargs(options)
    print_fn(f"Prompt: {ids.shape[1]} tokens (document + question). Question: {options.question}\n")
    print_fn("TriForce answer (streamed):")
    fast = measure(model, ids, streamer=TextStreamer(tokenizer, skip_prompt=True), seed=options.seed,
                   triforce_config=config, **kwargs)  # fmt: skip
    print_fn("\nRunning plain generate() on the same input for comparison ...")
    plain = measure(model, ids, seed=options.seed, **kwargs)
    result = Comparison(plain, fast, kwargs)
    print_fn(format_table(result, options, config, tokenizer, ids.shape[1]))
    return result


def _generate_kwargs(options: DemoOptions) -> dict:
    if options.temperature > 0:
        return dict(max_new_tokens=options.max_new_tokens, do_sample=True, temperature=options.temperature,
                    top_p=options.top_p)  # fmt: skip
    return dict(max_new_tokens=options.max_new_tokens, do_sample=False)


def format_table(result: Comparison, options: DemoOptions, config: TriForceConfig, tokenizer, prompt: int) -> str:
    """The comparison as a small text table."""
    stats = result.triforce.stats
    draft, retrieval = stats["levels"]["level0"], stats["levels"]["level1"]
    rows = [
        ("", "plain generate()", "TriForce"),
        ("new tokens", str(result.plain.new_tokens), str(result.triforce.new_tokens)),
        ("prefill (s)", f"{result.plain.prefill_seconds:.1f}", f"{result.triforce.prefill_seconds:.1f}"),
        ("decode tokens/s", _tps(result.plain), _tps(result.triforce)),
    ]
    width = max(len(r[0]) for r in rows) + 2
    lines = ["", f"{'':{width}}{rows[0][1]:>18}{rows[0][2]:>12}"]
    lines += [f"{name:{width}}{a:>18}{b:>12}" for name, a, b in rows[1:]]
    lines += [
        f"speedup (decode, prefill excluded): {result.speedup:.2f}x",
        f"level-0 -> 1 ({config.drafter}) acceptance: {_rate(draft)}",
        f"level-1 (retrieval, budget {config.retrieval_budget}) -> full cache acceptance: {_rate(retrieval)}",
        f"mean tokens per full-cache forward: {stats['mean_accepted_length']:.2f} (plain: 1.00)",
        f"identical text: {_identical(result, options, tokenizer, prompt)}",
        f"KV memory: full cache {_mib(stats['full_cache_bytes'])}, retrieval view {_mib(stats['view_bytes'])}"
        f" ({config.retrieval_budget}-token budget), draft cache {_mib(stats['draft_cache_bytes'])}",
        f"peak process memory (RSS): {_mib(peak_rss_bytes())}",
    ]
    return "\n".join(lines)


def _identical(result: Comparison, options: DemoOptions, tokenizer, prompt: int) -> str:
    if options.temperature > 0:
        return "n/a when sampling (same distribution, different draws)"
    texts = [tokenizer.decode(r.sequences[0, prompt:]) for r in (result.plain, result.triforce)]
    return "yes" if result.identical and texts[0] == texts[1] else "NO (please report this as a bug)"


def _tps(run: RunResult) -> str:
    return f"{run.tokens_per_second:.1f}"


def _rate(level: dict) -> str:
    if not level["drafted"]:
        return "n/a (nothing drafted)"
    return f"{level['acceptance_rate']:.2f} ({level['accepted']}/{level['drafted']})"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
