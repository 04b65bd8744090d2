"""Where a decoding step's time goes, against its bytes: this machine's read bandwidth, then each phase of a TriForce
round (level-1 step at several views and widths, the full-cache verification, a plain step, a re-selection) timed in
isolation on SmolLM2-135M-Instruct over a real 7K-token prompt, beside the bytes it reads.

    python -m research.phase_costs --output benchmarks/results/phase-costs/cpu-7k.json

The phases take turns: in each of ``--repeats`` rounds (after a warm-up round) every phase runs ``--calls`` times, and
the table reports each phase's median over the rounds, so the machine's slow stretches (on 2 shared cores a plain step
moves by 20% between minutes) fall on every phase alike. ``share`` is the phase's bytes per
millisecond as a share of the measured read bandwidth (a ``sum`` over 1 GiB); ``x bytes`` is the phase's time over
its bytes' time at the plain step's own achieved bandwidth (how the issues state "within 1.5x of its bytes"). The
fixed per-forward cost is a level-1 step over a 16-token view: its bytes are the weights alone.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import DynamicCache

import hf_triforce
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
from hf_triforce.hf.model import step_bytes
from hf_triforce.hf.versions import cache_kwargs


def read_bandwidth(gib: float = 1.0, repeats: int = 9) -> dict[str, float]:
    """Bytes/s of a ``sum`` and of a ``copy_`` over ``gib`` GiB of float32 (median of ``repeats``)."""
    x = torch.randn(int(gib * 2**28))
    y = torch.empty_like(x)
    out = {}
    for name, fn, factor in (("sum", lambda: x.sum(), 1), ("copy", lambda: y.copy_(x), 2)):
        seconds = median_seconds(fn, repeats, warmup=2)
        out[name] = factor * x.nbytes / seconds
    return out


def median_seconds(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(phases: list[tuple[Callable[[], object], dict]], rounds: int, calls: int) -> list[dict]:
    """Each phase's row with ``ms``: the median over ``rounds`` of its mean over ``calls`` calls, the phases taking
    turns within every round (after a warm-up round), so that a slow stretch of the machine slows every phase alike
    rather than the one timed during it."""
    times: list[list[float]] = [[] for _ in phases]
    for round_ in range(rounds + 1):
        for (fn, _), each in zip(phases, times, strict=True):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if round_:  # round 0 warms up
                each.append((time.perf_counter() - start) / calls)
    return [{**row, "ms": 1e3 * statistics.median(each)} for (_, row), each in zip(phases, times, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="reference")
    parser.add_argument("--tokens", type=int, default=7000)
    parser.add_argument("--repeats", type=int, default=30, help="rounds, each phase timed in turn in each")
    parser.add_argument("--calls", type=int, default=3, help="calls of a phase per round (their mean is a sample)")
    parser.add_argument("--views", default="16,512,4096")
    parser.add_argument("--level1-weights", choices=("int8", "int4"), default="int4", help="level 1's copy")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    bandwidth = read_bandwidth()
    model, tokenizer = load_smollm2()
    hf_triforce.enable(model)
    level1 = args.level1_weights
    prompt = bench_prompt(args.prompt)
    ids = question_prompt(tokenizer, prompt.text(), prompt.question, args.tokens)
    n = ids.shape[1]
    phases: list[tuple[Callable[[], object], dict]] = []  # timed together below, round by round

    def record(phase: str, fn: Callable[[], object], n_bytes: int, **extra) -> None:
        phases.append((fn, {"phase": phase, "bytes": n_bytes, **extra}))

    with torch.no_grad():
        # plain: one token at a time over transformers' static cache (the fastest plain decoding on this CPU) and
        # its default DynamicCache (which copies the whole cache at every step)
        weights, level1_weights, kv_per_token = step_bytes(model, level1)
        plain_bytes = weights + (n + 1) * kv_per_token
        token, position = ids[:, -1:], torch.tensor([n - 1])
        static = Prefix(model, ids, new_tokens=16).copy("static")  # the bench's static cache, the prompt but its last
        kwargs = dict(input_ids=token, cache_position=position, use_cache=True, **cache_kwargs(static))
        step = functools.partial(model, **kwargs)  # rewrites the last token's slot each time
        record("plain step (static cache)", step, plain_bytes, width=1)
        dynamic = DynamicCache(config=model.config)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(dynamic))

        def dynamic_step() -> None:
            model(input_ids=token, use_cache=True, **cache_kwargs(dynamic))
            dynamic.crop(-1)

        record("plain step (DynamicCache)", dynamic_step, plain_bytes, width=1)

        cache = RetrievalCache(model.config.num_hidden_layers, 8, capacity=n + 64)
        capture = QueryCapture()
        with capturing_queries(model, capture, 1):
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))
        queries = capture.at(-1)

        def verify(width: int) -> None:
            tail, positions = ids[:, -width:], torch.arange(n, n + width)[None]
            with swapped_linears([model]), capturing_queries(model, capture, width):
                model(input_ids=tail, position_ids=positions, use_cache=True, logits_to_keep=width,
                      **cache_kwargs(cache))  # fmt: skip
            cache.crop(-width)

        for width in (1, 7):
            record("verification (full cache)", functools.partial(verify, width), plain_bytes, width=width)

        decoder = direct_decoder(model, level1)

        def level1_step(tokens: torch.Tensor, view) -> None:
            decoder.logits(tokens, n, view)
            view.crop(-tokens.shape[0])

        for budget in map(int, args.views.split(",")):
            recent = max(8, budget // 4 // 8 * 8)
            if budget > 16:
                choose = functools.partial(cache.select, queries, budget, recent, None, 4)
                record("re-selection: choose", choose, 0, view=budget)
            indices = cache.select(queries, budget, recent, None, 4)
            view = cache.sparse_view(indices, 32)
            if budget > 16:
                record("re-selection: gather", functools.partial(view.refresh, indices), 2 * budget * kv_per_token,
                       view=budget)  # fmt: skip
            for width in (1, 3):
                name = "level-1 step (fixed cost: weights only)" if budget <= 16 else "level-1 step"
                fn = functools.partial(level1_step, ids[0, -width:], view)
                record(name, fn, level1_weights + budget * kv_per_token, view=budget, width=width)

        rows = interleaved_medians(phases, args.repeats, args.calls)

    plain_ms = rows[0]["ms"]  # the static cache's step
    plain_rate = plain_bytes / plain_ms  # bytes per ms the plain step achieves
    for row in rows:
        row["share_of_sum_bandwidth"] = row["bytes"] / (row["ms"] / 1e3) / bandwidth["sum"] if row["bytes"] else None
        row["x_bytes_time_at_plain_rate"] = row["ms"] / (row["bytes"] / plain_rate) if row["bytes"] else None
    result = {
        "what": f"phase costs against bytes, SmolLM2-135M-Instruct fp32, direct level-1 forward {level1}",
        "command": "python -m research.phase_costs "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "machine": machine_info(),
        "prompt": args.prompt,
        "context_tokens": n,
        "bandwidth_bytes_per_s": bandwidth,
        "level1_weight_bytes": level1_weights,
        "plain_weight_bytes": weights,
        "rows": rows,
    }
    print(markdown(result))
    if args.output is not None:
        write_results(result, args.output, markdown)


def markdown(result: dict) -> str:
    bw = result["bandwidth_bytes_per_s"]
    lines = [
        f"Read bandwidth: sum {bw['sum'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s (read + write). "
        f"Context {result['context_tokens']} tokens.",
        "",
        "| phase | view | width | ms | MB read | GB/s | share of sum bandwidth | x bytes' time at the plain rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        mb = r["bytes"] / 1e6
        rate = f"{r['bytes'] / r['ms'] / 1e6:.1f}" if r["bytes"] else "-"
        share = f"{r['share_of_sum_bandwidth']:.0%}" if r["share_of_sum_bandwidth"] else "-"
        times = f"{r['x_bytes_time_at_plain_rate']:.2f}" if r["x_bytes_time_at_plain_rate"] else "-"
        lines.append(
            f"| {r['phase']} | {r.get('view', '-')} | {r.get('width', '-')} | {r['ms']:.1f} | {mb:.0f} | {rate} | "
            f"{share} | {times} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
