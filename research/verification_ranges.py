"""The CPU verification's attention in key ranges (``kernels/verify_cpu.py``) against one SDPA call over all the keys
(``verify_attention_reference``, what the CPU ran before), interleaved in one process on SmolLM2-135M-Instruct at 7K
tokens: a seven-token verification forward timed alone on the reference manual, then whole default-config calls on
the bench's seven prompts (decode timed from the first streamed token to the last; the costs the planner calibrates
once per process are shared by both arms, so the same seed runs the same rounds), with whether both gave one text.

    python -m research.verification_ranges --output benchmarks/results/counts-not-clocks/verification-ranges-7k.json

Run it alone: on 2 cores anything else running moves the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import time
from pathlib import Path

import torch

import hf_triforce
import hf_triforce.kernels.verification as verification
from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.generate_kwargs import generate_kwargs
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.prefix import Prefix
from hf_triforce.bench.prompt_set import BENCH_PROMPTS, bench_prompt
from hf_triforce.bench.results import write_json
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.bench.timed_run import WARM_UP_TOKENS, measure
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.hf.attention import QueryCapture, capturing_queries
from hf_triforce.hf.linears import swapped_linears
from hf_triforce.hf.versions import cache_kwargs

logger = logging.getLogger("verification_ranges")
ARMS = ("one_call", "ranges")


@contextlib.contextmanager
def arm(name: str):
    """Within the block, the CPU verification runs key ranges (``"ranges"``) or one SDPA call (``"one_call"``)."""
    ranges = verification.verify_attention_cpu
    if name == "one_call":
        verification.verify_attention_cpu = lambda *args, **kwargs: None  # the dispatcher's reference
    try:
        yield
    finally:
        verification.verify_attention_cpu = ranges


def verification_forward(model, tokenizer, width: int, rounds: int) -> dict:
    """A ``width``-token full-cache forward over the reference manual's 7K tokens, ``rounds`` interleaved rounds of
    three timed forwards an arm (their median each)."""
    prompt = bench_prompt("reference")
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, 7000)
    n = ids.shape[1]
    cache, capture = RetrievalCache(model.config.num_hidden_layers, 8, capacity=n + 64), QueryCapture()
    with torch.no_grad(), capturing_queries(model, capture, 1):
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))

    def forward() -> torch.Tensor:
        tail, positions = ids[:, -width:], torch.arange(n, n + width)[None]
        with torch.no_grad(), swapped_linears([model]), capturing_queries(model, capture, width):
            out = model(input_ids=tail, position_ids=positions, use_cache=True, logits_to_keep=width,
                        **cache_kwargs(cache))  # fmt: skip
        cache.crop(-width)
        return out.logits

    logits, ms = {}, {name: [] for name in ARMS}
    for name in ARMS:
        with arm(name):
            logits[name] = forward()
    for _ in range(rounds):
        for name in ARMS:
            with arm(name):
                forward()
                times = []
                for _ in range(3):
                    start = time.perf_counter()
                    forward()
                    times.append(time.perf_counter() - start)
            ms[name].append(1e3 * statistics.median(times))
    return {
        "context_tokens": n,
        "width": width,
        "ms": ms,
        "median_ms": {name: statistics.median(values) for name, values in ms.items()},
        "logits_max_abs_difference": float((logits["one_call"] - logits["ranges"]).abs().max()),
        "same_argmax": bool(torch.equal(logits["one_call"].argmax(-1), logits["ranges"].argmax(-1))),
    }


def calls(model, tokenizer, temperature: float, pairs: int) -> list[dict]:
    """Each bench prompt at 7K: a warm-up call, then ``pairs`` interleaved default-config calls an arm."""
    rows = []
    for prompt in BENCH_PROMPTS:
        ids = question_prompt(tokenizer, prompt.text(), prompt.question, 7000)
        kwargs = generate_kwargs(128, temperature, 0.9, min_new_tokens=128)
        prefix = Prefix(model, ids, 128)
        short = {**kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}
        measure(model, ids, triforce_config=TriForceConfig(), **cache_kwargs(prefix.copy()), **short)
        ms, texts = {name: [] for name in ARMS}, {name: [] for name in ARMS}
        for i in range(pairs):
            for name in ARMS:
                with arm(name):
                    seed = i if temperature > 0 else 0
                    result = measure(model, ids, seed=seed, triforce_config=TriForceConfig(),
                                     **cache_kwargs(prefix.copy()), **kwargs)  # fmt: skip
                ms[name].append(1e3 * result.decode_seconds_per_token)
                texts[name].append(result.sequences)
        same = all(torch.equal(a, b) for a, b in zip(texts["one_call"], texts["ranges"], strict=True))
        ratio = statistics.median(ms["one_call"]) / statistics.median(ms["ranges"])
        logger.info("%s T=%s: %s identical=%s ratio %.3f", prompt.name, temperature, ms, same, ratio)
        rows.append({"prompt": prompt.name, "temperature": temperature, "ms_per_token": ms, "identical_text": same,
                     "one_call_over_ranges": ratio})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    forward = verification_forward(model, tokenizer, width=7, rounds=8)
    logger.info("verification forward: %s", forward["median_ms"])
    rows = [row for t in (0.0, 0.6) for row in calls(model, tokenizer, t, args.pairs)]
    medians = {
        str(t): statistics.median(r["one_call_over_ranges"] for r in rows if r["temperature"] == t) for t in (0.0, 0.6)
    }
    logger.info("median one_call / ranges by temperature: %s", medians)
    result = {
        "command": f"python -m research.verification_ranges --pairs {args.pairs}",
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "verification_forward": forward,
        "rows": rows,
        "median_one_call_over_ranges": medians,
    }
    if args.output:
        write_json(result, args.output, indent=1)


if __name__ == "__main__":
    main()
