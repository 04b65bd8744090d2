"""``make demo``: a real model answers a question about a long document, with and without TriForce."""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass

from transformers import TextStreamer

from .bench.comparison import Comparison
from .bench.documents import (
    DEFAULT_DOCUMENT_TOKENS,
    DEFAULT_QUESTION,
    DocumentError,
    DocumentQuestion,
    question_prompt,
    read_document,
)
from .bench.formatting import acceptance_rate, mib, number, per_token_acceptance
from .bench.generate_kwargs import generate_kwargs
from .bench.loading import load_model
from .bench.machine import machine_info
from .bench.prompt_set import BENCH_PROMPTS, BenchPrompt, bench_prompt, user_prompt
from .bench.questions import DEFAULT_QUESTIONS, QuestionsResult, ask_questions
from .bench.repetition import DEFAULT_REPETITION_PENALTY, LOOP_FRACTION, LOOP_NGRAM, repeated_fraction
from .bench.results import write_json
from .bench.timed_run import measure, peak_rss_bytes, warm_up
from .config import TriForceConfig
from .errors import TriForceConfigError
from .generation import enable
from .hf.model import context_limit
from .hf.processors import answer_repetition_penalty, custom_processor_replaces_builtin

logger = logging.getLogger(__name__)

PROMPT_NAMES = tuple(p.name for p in BENCH_PROMPTS)


@dataclass
class DemoOptions(DocumentQuestion):
    """What the demo runs; the CLI fills it from ``hf-triforce demo`` arguments.

    Attributes:
        temperatures: each is one plain/TriForce comparison, in order (0 is greedy: the texts must be identical).
        repetition_penalty: a penalty on the answer's own tokens, the prompt's tokens free
            (:func:`~hf_triforce.hf.processors.answer_repetition_penalty`), given to both runs alike; ``None`` or
            1.0 for none. A small model's long answers otherwise drift into a loop.
        output: a JSON file for the figures (with the machine record), or None.
        prompt: one of the bench's documents and questions by name
            (:data:`~hf_triforce.bench.prompt_set.BENCH_PROMPTS`: prose, reference, code, guide,
            changelog, table, transcript) instead of ``document``/``question``; None: those (by default the Python
            language reference and the ``__getattr__`` question).
    """

    document_tokens: int | None = DEFAULT_DOCUMENT_TOKENS
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 0.6)
    top_p: float = 0.9
    budget: int | str = "auto"
    drafter: str = "auto"
    seed: int = 0
    questions: int = 1
    repetition_penalty: float | None = DEFAULT_REPETITION_PENALTY
    output: str | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise TriForceConfigError(f"temperatures {self.temperatures}: give one or more values >= 0.")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise TriForceConfigError(f"repetition_penalty={self.repetition_penalty} must be > 0 (1.0: none).")


def run_demo(options: DemoOptions, print_fn=print) -> list[Comparison]:
    """Per temperature: stream a TriForce answer, run plain ``generate()`` on the same input, print a table.

    Returns:
        one comparison per temperature of ``options.temperatures``, in order.

    Example:
        >>> run_demo(DemoOptions(max_new_tokens=16, temperatures=(0.0,)))[0].identical  # doctest: +SKIP
        True
    """
    if options.questions > 1:
        return run_questions_demo(options, print_fn)
    config = TriForceConfig(retrieval_budget=options.budget, drafter=options.drafter)
    prompt = demo_prompt(options)
    model, tokenizer = load_model(options.model)
    enable(model)
    limit = context_limit(model)
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, options.document_tokens, limit,
                          options.max_new_tokens)  # fmt: skip
    print_fn(f"Document: {prompt.source} ({prompt.genre}; --prompt chooses another of: {', '.join(PROMPT_NAMES)}).")
    print_fn(f"Prompt: {ids.shape[1]} tokens (document + question). Question: {prompt.question}")
    results = [_compare(model, tokenizer, ids, config, options, t, print_fn) for t in options.temperatures]
    print_fn(format_summary(results, options))
    if options.output:
        print_fn(f"wrote {write_json(demo_record(results, options, tokenizer, ids.shape[1]), options.output)}")
    return results


def demo_prompt(options: DemoOptions) -> BenchPrompt:
    """The document and question the demo asks: ``options.prompt`` of the bench's set, or the user's
    ``document``/``question`` (read now, before the model is loaded).

    Raises:
        DocumentError: an unknown prompt name, ``prompt`` together with ``document``, or an unreadable document.

    Example:
        >>> demo_prompt(DemoOptions(prompt="code")).source
        'argparse.py'
    """
    if options.prompt is None:
        return user_prompt(options.document, options.question)
    if options.document is not None:
        raise DocumentError("--prompt picks one of the bench's documents: drop it, or drop --document.")
    return bench_prompt(options.prompt)


def _compare(model, tokenizer, ids, config, options: DemoOptions, temperature: float, print_fn) -> Comparison:
    """One temperature: the TriForce answer streamed, then plain ``generate()`` on the same input, then the table."""
    kwargs = _generate_kwargs(options, temperature, ids.shape[1])
    print_fn(f"\nTriForce answer at {_temperature(temperature, options.top_p)} (streamed):")
    with custom_processor_replaces_builtin():
        fast = measure(model, ids, streamer=TextStreamer(tokenizer, skip_prompt=True), seed=options.seed,
                       keep_logits=True, triforce_config=config, **kwargs)  # fmt: skip
        print_fn("\nRunning plain generate() on the same input for comparison ...")
        plain = measure(model, ids, seed=options.seed, keep_logits=True, **kwargs)
    result = Comparison(plain, fast, kwargs, dtype=model.dtype)  # logits and dtype: a difference is classified
    print_fn(format_table(result, options, config, tokenizer, ids.shape[1]))
    return result


def run_questions_demo(options: DemoOptions, print_fn=print) -> list[QuestionsResult]:
    """``--questions N``: N questions about one document, the document prefilled once into a cache.

    Plain ``generate()`` without reuse, plain ``generate()`` from a copy of the prefilled cache and TriForce from a
    copy of the same cache, each timed per question (own prefill, decode speed, end to end) and in total, at each
    temperature of ``options.temperatures``.

    Example:
        >>> options = DemoOptions(questions=2, max_new_tokens=16, temperatures=(0.0,))
        >>> result = run_questions_demo(options)  # doctest: +SKIP
        >>> result[0].identical("plain", "triforce_reuse")  # doctest: +SKIP
        [True, True]
    """
    questions = _questions(options)  # refused before the model is loaded
    config = TriForceConfig(retrieval_budget=options.budget, drafter=options.drafter)
    model, tokenizer = load_model(options.model)
    enable(model)
    document, limit = read_document(options.document), context_limit(model)
    prompts = [question_prompt(tokenizer, document, q, options.document_tokens, limit, options.max_new_tokens)
               for q in questions]  # fmt: skip
    results = []
    with custom_processor_replaces_builtin():
        warm_up(model, prompts[0], config, _generate_kwargs(options, options.temperatures[0], prompts[0].shape[1]))
    for temperature in options.temperatures:
        print_fn(f"\nAt {_temperature(temperature, options.top_p)}:")
        per_prompt = functools.partial(_generate_kwargs, options, temperature)
        with custom_processor_replaces_builtin():
            result = ask_questions(model, prompts, config, seed=options.seed, prompt_kwargs=per_prompt)
        print_fn(format_questions(result, questions, tokenizer, temperature > 0))
        results.append(result)
    if options.output:
        record = {"kind": "demo-questions", "machine": machine_info(), "questions": questions,
                  "options": _options_record(options), "temperatures": list(options.temperatures),
                  "results": [r.to_dict() for r in results]}  # fmt: skip
        print_fn(f"wrote {write_json(record, options.output)}")
    return results


def _generate_kwargs(options: DemoOptions, temperature: float, prompt_length: int) -> dict:
    """Both runs' ``generate()`` arguments at ``temperature``, with the answer-only repetition penalty if any."""
    kwargs = generate_kwargs(options.max_new_tokens, temperature, options.top_p)
    if options.repetition_penalty not in (None, 1.0):
        kwargs.update(answer_repetition_penalty(options.repetition_penalty, prompt_length))
    return kwargs


def _temperature(temperature: float, top_p: float) -> str:
    return "T=0 (greedy)" if temperature == 0 else f"T={temperature:g} (top-p {top_p:g})"


def _questions(options: DemoOptions) -> list[str]:
    first = [options.question] if options.question != DEFAULT_QUESTION else []
    pool = [*first, *(q for q in DEFAULT_QUESTIONS if q not in first)]
    if options.questions > len(pool):
        raise TriForceConfigError(
            f"--questions {options.questions}: the demo has {len(pool)} questions; pass at most that."
        )
    return pool[: options.questions]


def format_questions(result: QuestionsResult, questions: list[str], tokenizer, sampled: bool) -> str:
    """Per question and in total: own prefill, decode speed and end-to-end time of each mode, identical text."""
    names = {"plain": "plain, no reuse", "plain_reuse": "plain + reuse", "triforce_reuse": "TriForce + reuse"}
    lines = [f"\nShared prefix (chat template + document): {result.prefix_tokens} tokens, prefilled once in "
             f"{result.prefix_seconds:.1f} s (counted in both reuse totals)."]  # fmt: skip
    same = [all(pair) for pair in zip(*(result.identical("plain", m) for m in list(result.answers)[1:]), strict=True)]
    for i, question in enumerate(questions):
        answer = result.answers["triforce_reuse"][i].run
        text = tokenizer.decode(answer.sequences[0, result.prompts[i].shape[1] :], skip_special_tokens=True)
        lines += ["", f"Q{i + 1}: {question}", f"A{i + 1}: {text.strip()}"]
        for mode in result.answers:
            a = result.answers[mode][i]
            lines.append(f"  {names[mode]:<18} prefill {a.run.prefill_seconds:6.2f} s   decode "
                         f"{a.run.tokens_per_second:6.1f} tok/s   end to end {a.seconds:6.1f} s")  # fmt: skip
        lines.append(f"  identical text: {'n/a when sampling' if sampled else ('yes' if same[i] else 'NO')}")
    lines += ["", "Total, end to end:"]
    total = {m: result.end_to_end_seconds(m) for m in result.answers}
    for mode, seconds in total.items():
        lines.append(f"  {names[mode]:<18} {seconds:7.1f} s   ({total['plain'] / seconds:.2f}x plain, no reuse)")
    lines.append(f"TriForce + reuse vs plain + reuse: {total['plain_reuse'] / total['triforce_reuse']:.2f}x")
    return "\n".join(lines)


def format_summary(results: list[Comparison], options: DemoOptions) -> str:
    """One line per temperature: decode speedup and whether the greedy texts were identical."""
    lines = ["", "Summary (decode speed, prefill excluded):"]
    for temperature, result in zip(options.temperatures, results, strict=True):
        same = "n/a (sampling)" if temperature > 0 else ("yes" if result.identical else "NO")
        plain, fast = (number(r.tokens_per_second, 1) for r in (result.plain, result.triforce))
        lines.append(f"  {_temperature(temperature, options.top_p):<22} plain {plain} tok/s, TriForce {fast} tok/s: "
                     f"{result.speedup:.2f}x   identical text: {same}")  # fmt: skip
    return "\n".join(lines)


def demo_record(results: list[Comparison], options: DemoOptions, tokenizer, prompt_tokens: int) -> dict:
    """The demo's figures as JSON-ready data: options, machine, and per temperature the comparison row with the
    TriForce answer's text and :func:`repeated_fraction`."""
    rows = []
    for temperature, result in zip(options.temperatures, results, strict=True):
        answer = result.triforce.sequences[0, prompt_tokens:].tolist()
        rows.append(dict(result.to_dict(), temperature=temperature, answer=tokenizer.decode(answer,
                         skip_special_tokens=True), answer_repeated_fraction=repeated_fraction(answer)))  # fmt: skip
    return {
        "kind": "demo",
        "machine": machine_info(),
        "document": options.document or "python-reference",
        "question": options.question,
        "prompt_tokens": prompt_tokens,
        "options": _options_record(options),
        "repetition_penalty_scope": "answer tokens only (prompt_ignore_length)",
        "rows": rows,
    }


def _options_record(options: DemoOptions) -> dict:
    return {k: v for k, v in asdict(options).items() if k not in ("model", "output")}


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
    budget = config.for_context(prompt).retrieval_budget
    lines += [
        f"speedup (decode, prefill excluded): {result.speedup:.2f}x",
        f"level-0 ({config.drafter}) -> level-1 acceptance: {_rate(level0)}",
        f"level-1 (retrieval view, budget {budget}) -> level-2 (full cache) acceptance: {_rate(level1)}",
        f"rounds by schedule (adaptive={config.adaptive}): {_rounds(stats)}",
        f"mean tokens per full-cache forward: {stats['mean_accepted_length']:.2f} (plain: 1.00)",
        f"identical text: {_identical(result, tokenizer, prompt)}",
        f"answer repeats itself: {_repeats(result.triforce.sequences[0, prompt:].tolist())}",
        f"KV memory: full cache {mib(stats['full_cache_bytes'])}, retrieval view {mib(stats['view_bytes'])}"
        f" ({budget}-token budget), draft cache {mib(stats['draft_cache_bytes'])}",
        f"peak process memory (RSS): {mib(peak_rss_bytes())}",
    ]
    return "\n".join(lines)


def _identical(result: Comparison, tokenizer, prompt: int) -> str:
    if result.generate_kwargs.get("do_sample"):
        return "n/a when sampling (same distribution, different draws)"
    texts = [tokenizer.decode(r.sequences[0, prompt:]) for r in (result.plain, result.triforce)]
    return "yes" if result.identical and texts[0] == texts[1] else "NO (please report this as a bug)"


def _repeats(answer: list[int]) -> str:
    fraction = repeated_fraction(answer)
    verdict = "no" if fraction == 0 else ("a loop" if fraction > LOOP_FRACTION else "in places")
    return f"{verdict} ({fraction:.0%} of its {LOOP_NGRAM}-token spans occurred earlier in it)"


def _rounds(stats: dict) -> str:
    names = {"levels": "level 0 -> 1 -> 2", "level0": "level 0 -> 2", "plain": "plain"}
    rounds = stats.get("rounds") or {}
    parts = [f"{names.get(k, k)} {n}" for k, n in rounds.items() if n]
    skip = stats["levels"]["level0_to_level2"]
    if skip["drafted"]:
        parts.append(f"level-0 -> level-2 acceptance {_rate(skip)}")
    return ", ".join(parts) or "none"


def _rate(level: dict) -> str:
    """The round rate with its counts, then the per-token acceptance (alpha), e.g. ``0.44 (8/18), per token 0.80``."""
    rate = acceptance_rate(level, counts=True, none="n/a (nothing drafted)")
    alpha = per_token_acceptance(level, none="")
    return f"{rate}, per token {alpha}" if alpha else rate
