"""Whether the adaptive planner's round lengths pay at 7K: the default planner, the planner with every level 0 -> 1 -> 2
round drafting ``gamma2`` tokens (no length chosen, no confidence stops; ``Planner`` patched for that arm only), and
fixed chains (``adaptive=False``), interleaved per prompt and temperature on the bench's seven prompts (sampled
pair ``i`` with seed ``i``), decode timed from the first streamed token to the last.

    python -m research.full_rounds_ab --pairs 2 --output benchmarks/results/counts-not-clocks/full-rounds-7k.json

Run it alone: on 2 cores anything else running moves the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
from pathlib import Path

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.generate_kwargs import generate_kwargs
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.prefix import Prefix
from hf_triforce.bench.prompt_set import BENCH_PROMPTS
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.bench.timed_run import WARM_UP_TOKENS, measure
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.hierarchy.planner import Plan, Planner

logger = logging.getLogger("full_rounds_ab")
ARMS = {
    "planner": (TriForceConfig(), False),
    "full": (TriForceConfig(), True),
    "fixed": (TriForceConfig(adaptive=False), False),
}


@contextlib.contextmanager
def full_rounds(on: bool):
    """Within the block (``on``), levels rounds always draft ``gamma2`` tokens."""
    best_of, keep = Planner._best_of, Planner.keep_drafting
    if on:
        Planner._best_of = lambda self, kind: (
            Plan("levels", self.config.gamma2) if kind == "levels" else best_of(self, kind)
        )
        Planner.keep_drafting = lambda self, drafted, survival: True
    try:
        yield
    finally:
        Planner._best_of, Planner.keep_drafting = best_of, keep


def row(model, tokenizer, prompt, temperature: float, pairs: int) -> dict:
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, 7000)
    kwargs = generate_kwargs(128, temperature, 0.9, min_new_tokens=128)
    prefix = Prefix(model, ids, 128)
    short = {**kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}
    for config, on in ARMS.values():  # warm-up; the first planner call times its costs
        with full_rounds(on):
            measure(model, ids, triforce_config=config, **cache_kwargs(prefix.copy()), **short)
    runs: dict[str, list[float]] = {name: [] for name in ARMS}
    for i in range(pairs):
        for name, (config, on) in ARMS.items():
            with full_rounds(on):
                seed = i if temperature > 0 else 0
                result = measure(model, ids, seed=seed, triforce_config=config, **cache_kwargs(prefix.copy()), **kwargs)
            runs[name].append(1e3 * result.decode_seconds_per_token)
    ms = {name: statistics.median(values) for name, values in runs.items()}
    ratios = {f"{name}_over_fixed": ms["fixed"] / ms[name] for name in ("planner", "full")}
    logger.info("%s T=%s: %s %s", prompt.name, temperature, runs, {k: round(v, 2) for k, v in ratios.items()})
    return {"prompt": prompt.name, "temperature": temperature, "ms_per_token": runs, **ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    rows = [row(model, tokenizer, p, t, args.pairs) for p in BENCH_PROMPTS for t in (0.0, 0.6)]
    result = {
        "command": f"python -m research.full_rounds_ab --pairs {args.pairs}",
        "machine": machine_info(),
        "rows": rows,
    }
    if args.output:
        args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
