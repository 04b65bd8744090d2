"""Which one-row product pays inside a forward on this CPU? The full-cache verification (TriForce's level-2 forward)
over a real 7K-token prompt, SmolLM2-135M-Instruct in float32, with every one-row linear as the two-column product and
as ``F.linear``, interleaved in one process beside a plain static-cache step; a level-1 step (int4, 512-token view) for
scale. The package's rule (:func:`hf_triforce.kernels.linear.one_row_product_faster`, from the CPU's capability) is
recorded beside the result it should agree with.

    python -m research.one_row_linear --output benchmarks/results/one-row-linear-7k-avx512.json

Reports each arm's median and the median of per-repeat ratios (paired: one machine state per repeat). Run it alone: on
2 cores anything else running moves the timings.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import torch

import hf_triforce
import hf_triforce.kernels.linear as linear
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.prefix import Prefix
from hf_triforce.bench.prompt_set import bench_prompt
from hf_triforce.bench.report import write_results
from hf_triforce.bench.smollm2 import load_smollm2
from hf_triforce.caches.retrieval import RetrievalCache
from hf_triforce.hf.attention import QueryCapture, capturing_queries
from hf_triforce.hf.direct_forward import direct_decoder
from hf_triforce.hf.linears import swapped_linears
from hf_triforce.hf.versions import cache_kwargs

RULE = linear.one_row_product_faster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="reference")
    parser.add_argument("--tokens", type=int, default=7000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    prompt = bench_prompt(args.prompt)
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, args.tokens)
    n = ids.shape[1]
    with torch.no_grad():
        static = Prefix(model, ids, new_tokens=16).copy("static")
        plain = functools.partial(model, input_ids=ids[:, -1:], cache_position=torch.tensor([n - 1]), use_cache=True,
                                  **cache_kwargs(static))  # fmt: skip
        cache, capture = RetrievalCache(model.config.num_hidden_layers, 8, capacity=n + 64), QueryCapture()
        with capturing_queries(model, capture, 1):
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))
        view = cache.sparse_view(cache.select(capture.at(-1), 512, 128, None, 4), 32)
        decoder = direct_decoder(model, "int4")

        def verify(width: int, two_column: bool) -> None:
            linear.one_row_product_faster = lambda: two_column
            positions = torch.arange(n, n + width)[None]
            with swapped_linears([model]), capturing_queries(model, capture, width):
                model(input_ids=ids[:, -width:], position_ids=positions, use_cache=True, logits_to_keep=width,
                      **cache_kwargs(cache))  # fmt: skip
            cache.crop(-width)
            linear.one_row_product_faster = RULE

        def level1(width: int) -> None:
            decoder.logits(ids[0, -width:], n, view)
            view.crop(-width)

        arms = {"plain step (static cache)": plain}
        for width in (1, 7, 9):
            arms[f"verification w{width}, two-column product"] = functools.partial(verify, width, True)
            arms[f"verification w{width}, F.linear"] = functools.partial(verify, width, False)
        arms |= {f"level-1 step w{w} (int4, view 512)": functools.partial(level1, w) for w in (1, 3)}
        for run in arms.values():  # warm-up
            run(), run()
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.repeats):
            for name, run in arms.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(seconds[a], seconds[b], strict=True))

    result = {
        "what": "one-row linear choice inside the full-cache verification, SmolLM2-135M-Instruct fp32, interleaved",
        "command": "python -m research.one_row_linear "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "machine": machine_info(),
        "context_tokens": n,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "rule_takes_two_column": RULE(),
        "median_ms": {name: 1e3 * statistics.median(v) for name, v in seconds.items()},
        "paired_ratio_f_linear_over_two_column": {
            w: paired(f"verification w{w}, F.linear", f"verification w{w}, two-column product") for w in (1, 7, 9)
        },
        "seconds": seconds,
    }
    print(markdown(result))
    if args.output is not None:
        write_results(result, args.output, markdown)


def markdown(result: dict) -> str:
    lines = [
        f"CPU capability {result['cpu_capability']}; context {result['context_tokens']} tokens; the package's rule "
        f"takes the two-column product for one row: {result['rule_takes_two_column']}.",
        "",
        "| arm | median ms |",
        "|---|---:|",
        *(f"| {name} | {ms:.1f} |" for name, ms in result["median_ms"].items()),
        "",
        "| verification width | F.linear / two-column product (median of paired ratios) |",
        "|---:|---:|",
        *(f"| {w} | {r:.3f} |" for w, r in result["paired_ratio_f_linear_over_two_column"].items()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
