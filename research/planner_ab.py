"""The adaptive planner against fixed chains (``adaptive=False``), and both against the fastest plain decoding, on the
bench's seven natural prompts: per prompt and temperature, one prefill, then interleaved calls (plain static, then
``--pairs`` times planner and fixed; sampled pairs with seeds 0, 1, ...: a sampled text's speed depends on the text),
decode timed from the first streamed token to the last.

    python -m research.planner_ab --output benchmarks/results/counts-not-clocks/planner-vs-fixed-7k.json

Reports per row the planner's decode ms/token (median of its calls), the fixed chains' and the static plain step's,
the ratio planner/fixed as tokens per second (the issue's bar: >= 0.97 on every row) and both speedups over plain,
with whether each call's text equals plain ``generate()``'s (greedy). Run it alone: on 2 cores anything else running
moves the timings.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.generate_kwargs import generate_kwargs
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.prefix import Prefix
from hf_triforce.bench.prompt_set import BENCH_PROMPTS
from hf_triforce.bench.report import write_results
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.bench.timed_run import WARM_UP_TOKENS, measure
from hf_triforce.hf.versions import cache_kwargs

logger = logging.getLogger("planner_ab")


def row(model, tokenizer, prompt, tokens: int, temperature: float, new_tokens: int, pairs: int) -> dict:
    """One prompt at one temperature: plain static once, then ``pairs`` interleaved (planner, fixed) calls."""
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, tokens)
    kwargs = generate_kwargs(new_tokens, temperature, 0.9, min_new_tokens=new_tokens)
    prefix = Prefix(model, ids, new_tokens)
    configs = {"planner": TriForceConfig(), "fixed": TriForceConfig(adaptive=False)}
    short = {**kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}
    measure(model, ids, **cache_kwargs(prefix.copy("static")), **short)
    calibration = None
    for config in configs.values():  # warm-up; the planner's first call of this kind times its costs here
        measure(model, ids, triforce_config=config, **cache_kwargs(prefix.copy()), **short)
        calibration = calibration or hf_triforce.last_stats(model).phases.to_dict().get("calibration")
    plain = measure(model, ids, **cache_kwargs(prefix.copy("static")), **kwargs)
    runs: dict[str, list] = {name: [] for name in configs}
    for i in range(pairs):  # sampled: pair i draws with seed i (a sampled text's speed depends on the text)
        seed = i if temperature > 0 else 0
        for name, config in configs.items():
            copy = cache_kwargs(prefix.copy())
            runs[name].append(measure(model, ids, seed=seed, triforce_config=config, **copy, **kwargs))
    ms = {name: 1e3 * statistics.median(r.decode_seconds_per_token for r in results) for name, results in runs.items()}
    ms["plain_static"] = 1e3 * plain.decode_seconds_per_token
    identical = {
        name: [bool(torch.equal(r.sequences, plain.sequences)) for r in results] for name, results in runs.items()
    }
    out = {
        "prompt": prompt.name,
        "temperature": temperature,
        "prompt_tokens": ids.shape[1],
        "ms_per_token": ms,
        "planner_over_fixed": ms["fixed"] / ms["planner"],  # tokens per second, planner / fixed
        "speedup_over_plain": {name: ms["plain_static"] / ms[name] for name in configs},
        "identical_to_plain": identical if temperature == 0 else None,
        "each_call_ms_per_token": {
            name: [1e3 * r.decode_seconds_per_token for r in results] for name, results in runs.items()
        },
        "stats": {name: results[-1].stats for name, results in runs.items()},
        "calibration_ms": None if calibration is None else calibration["ms_per_call"],
    }
    logger.info("%s T=%s: %s", prompt.name, temperature, {k: round(v, 1) for k, v in ms.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=7000)
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", default=",".join(p.name for p in BENCH_PROMPTS))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    chosen = [p for p in BENCH_PROMPTS if p.name in args.prompts.split(",")]
    rows = [
        row(model, tokenizer, prompt, args.tokens, float(t), args.new_tokens, args.pairs)
        for prompt in chosen
        for t in args.temperatures.split(",")
    ]
    result = {"command": "python -m research.planner_ab " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "output"
    ), "machine": machine_info(), "rows": rows}  # fmt: skip
    print(markdown(result))
    if args.output is not None:
        write_results(result, args.output, markdown)


def markdown(result: dict) -> str:
    lines = [
        "| prompt | T | planner ms/token | fixed ms/token | plain static ms/token | planner / fixed | planner x plain "
        "| fixed x plain | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ms, speed = r["ms_per_token"], r["speedup_over_plain"]
        same = "-" if r["identical_to_plain"] is None else str(all(all(v) for v in r["identical_to_plain"].values()))
        lines.append(
            f"| {r['prompt']} | {r['temperature']:g} | {ms['planner']:.1f} | {ms['fixed']:.1f} | "
            f"{ms['plain_static']:.1f} | {r['planner_over_fixed']:.2f} | {speed['planner']:.2f}x | "
            f"{speed['fixed']:.2f}x | {same} |"
        )
    for name in ("planner", "fixed"):
        for t in sorted({r["temperature"] for r in result["rows"]}):
            values = [r["speedup_over_plain"][name] for r in result["rows"] if r["temperature"] == t]
            lines.append(f"\nmedian {name} x plain static at T={t:g}: {statistics.median(values):.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
