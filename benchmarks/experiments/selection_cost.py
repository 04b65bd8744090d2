"""What one retrieval re-selection costs, per ``rescore_candidates`` factor, on one device (issue 18 item 3).

Times :meth:`hf_triforce.caches.RetrievalCache.select` for every layer of a model shape at once (what a refresh runs
before it gathers the view), on random post-RoPE keys: ``rescore_candidates`` 0 (chunk means alone, the default), 2,
4 and every chunk, at budgets 1/16 and 1/8 of the context, with the config's default recent window (``"auto"``: a
quarter of the budget) and look-ahead. Random keys rank differently from real ones, but the work is the same: it
depends on the shapes alone. Median of ``--repeats`` calls after warm-up (``torch.cuda.synchronize`` around each on
a GPU).

Run::

    python benchmarks/experiments/selection_cost.py --threads 1 --output benchmarks/results/cpu-selection-cost.json
    python benchmarks/experiments/selection_cost.py --device cuda --shape llama3.1-8b --tokens 131072 --output X.json

``--report X.json`` prints the markdown of a run.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import statistics
import sys
import time

import torch

from hf_triforce import TriForceConfig
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.caches.selection import EVERY_CHUNK
from hf_triforce.evaluation.common.machine import device_line, machine_info

# (layers, query heads, KV heads, head dim)
SHAPES = {"smollm2-135m": (30, 9, 3, 64), "llama3.1-8b": (32, 32, 8, 128)}
FACTORS = (0, 2, 4, EVERY_CHUNK)


def filled_cache(shape: str, tokens: int, device: str, dtype: torch.dtype) -> tuple[RetrievalCache, list]:
    """A cache of ``tokens`` random keys and values per layer, and one random ``[1, H_q, D]`` query per layer."""
    layers, hq, hkv, d = SHAPES[shape]
    g = torch.Generator(device=device).manual_seed(0)
    cache = RetrievalCache(num_layers=layers, chunk_size=8)
    for layer in range(layers):
        states = [torch.randn(1, hkv, tokens, d, generator=g, device=device).to(dtype) for _ in range(2)]
        cache.update(*states, layer)
    return cache, [torch.randn(1, hq, d, generator=g, device=device).to(dtype) for _ in range(layers)]


def median_ms(fn, repeats: int, device: str) -> float:
    """Median wall time of ``fn()`` in milliseconds, after 3 warm-up calls."""
    times = []
    for _ in range(repeats + 3):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[3:])


def run(shape: str, tokens: int, device: str, repeats: int) -> list[dict]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cache, queries = filled_cache(shape, tokens, device, dtype)
    rows = []
    for budget in (tokens // 16, tokens // 8):
        for factor in FACTORS:
            cfg = TriForceConfig(retrieval_budget=budget, rescore_candidates=factor)
            fn = functools.partial(cache.select, queries, budget, cfg.recent_tokens, cfg.lookahead_chunks,
                                   rescore_candidates=factor)  # fmt: skip
            rows.append({"budget": budget, "factor": factor, "ms": median_ms(fn, repeats, device)})
            print(rows[-1], flush=True)
    return rows


def report(path: str) -> str:
    rec = json.load(open(path))
    lines = [f"# One re-selection of every layer: {rec['shape']}, {rec['tokens']} cached tokens", "",
             device_line(rec), "", f"Command: `{rec['command']}`", "",
             "Median milliseconds of `RetrievalCache.select` for all layers (random keys; recent window a quarter of "
             "the budget, the default look-ahead), per `rescore_candidates`:", "",
             "| budget | " + " | ".join(map(_factor, FACTORS)) + " |", "|---:|" + "---:|" * len(FACTORS)]  # fmt: skip
    for budget in dict.fromkeys(r["budget"] for r in rec["rows"]):
        ms = {r["factor"]: r["ms"] for r in rec["rows"] if r["budget"] == budget}
        lines.append(f"| {budget} | " + " | ".join(f"{ms[f]:.2f}" for f in FACTORS) + " |")
    return "\n".join(lines)


def _factor(factor: int) -> str:
    return "every chunk" if factor == EVERY_CHUNK else ("0 (default)" if factor == 0 else f"x{factor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=7168)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", default="selection-cost.json")
    parser.add_argument("--report", help="a JSON result to print as markdown")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    rows = run(args.shape, args.tokens, args.device, args.repeats)
    command = "benchmarks/experiments/selection_cost.py " + shlex.join(sys.argv[1:])
    rec = {"shape": args.shape, "tokens": args.tokens, "machine": machine_info(), "command": command, "rows": rows}
    json.dump(rec, open(args.output, "w"), indent=1)
    print(report(args.output))


if __name__ == "__main__":
    main()
