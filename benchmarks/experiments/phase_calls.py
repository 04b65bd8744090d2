"""Every call of every TriForce phase, timed one by one: is a phase's mean its usual call or one slow call?

``hf-triforce bench`` reports a phase's mean over a call (``last_stats(model).phases``). A one-off inside the timed
call (Triton compiling a kernel variant, CUDA-graph capture, the allocator growing) then shows as a slow phase: on
an H200 the refresh's mean at 128K was 36 ms over 28 calls while its usual call took 5 ms (issue 18 item 3). This
script reads each call's duration (``last_stats(model).phases.durations``), for the default policy
(``rescore_candidates=4``), the chunk-mean ranking alone (``mean``: ``rescore_candidates=0``) and
``step_selection=True`` (level 1's direct forward, no CUDA graphs), on a random-weights shape preset or a real
model, after the bench's warm-up, and reports per phase the calls, the first call, the median and the largest.

Run (a GPU, about 2 minutes at 32K and 128K for the 8B shape)::

    python benchmarks/experiments/phase_calls.py --preset llama3.1-8b --contexts 32768,131072 \
        --output $OUT/phase-calls.json
    python benchmarks/experiments/phase_calls.py --report benchmarks/results/h200-phase-calls.json

On the CPU: ``--preset tiny --device cpu --dtype float32 --budget 128 --contexts 1024``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.evaluation.bench.timed_run import measure, warm_up
from hf_triforce.evaluation.common.machine import machine_info
from hf_triforce.evaluation.models.shapes import random_model

MODES = {
    "default": {},
    "mean": {"rescore_candidates": 0},  # the chunk-mean ranking alone, the default until 2026-11-28
    "step": {"step_selection": True, "cuda_graphs": False, "level1_forward": "direct"},
}


def calls_of(model, ids: torch.LongTensor, config: TriForceConfig, new_tokens: int) -> dict[str, list[float]]:
    """``{phase: [ms of each call, in order]}`` of one greedy TriForce call after the bench's warm-up."""
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    warm_up(model, ids, config, kwargs)
    measure(model, ids, triforce_config=config, **kwargs)
    durations = hf_triforce.last_stats(model).phases.durations
    return {phase: [round(1e3 * seconds, 3) for seconds in each] for phase, each in durations.items()}


def summary(per_phase: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per phase: calls, first, median, largest and mean ms.

    Example:
        >>> summary({"refresh": [1048.8, 4.4, 6.7, 4.2]})["refresh"]["median"]
        5.55
    """
    return {
        phase: {"calls": len(ms), "first": ms[0], "median": round(statistics.median(ms), 3), "max": max(ms),
                "mean": round(statistics.fmean(ms), 3)}
        for phase, ms in per_phase.items()
    }  # fmt: skip


def report(results: dict[str, Any]) -> str:
    """Markdown: one row per (context, mode, phase)."""
    lines = [
        f"Device: {results['machine'].get('cuda_device') or results['machine'].get('cpu')}; "
        f"torch {results['machine'].get('torch')}, transformers {results['machine'].get('transformers')}; "
        f"{results['machine'].get('date')}. Command: `{results['command']}`",
        "",
        "| context | mode | phase | calls | first ms | median ms | max ms | mean ms |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in results["runs"]:
        for phase, s in summary(run["calls"]).items():
            lines.append(
                f"| {run['context']} | {run['mode']} | {phase} | {s['calls']} | {s['first']:.1f} | {s['median']:.1f} "
                f"| {s['max']:.1f} | {s['mean']:.1f} |"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every context x mode of ``args``; the results as written to ``--output``."""
    contexts = [int(c) for c in args.contexts.split(",")]
    dtype = getattr(torch, args.dtype)
    model = random_model(args.preset, max(contexts) + args.new_tokens + 64, dtype, args.device)
    hf_triforce.enable(model)
    runs = []
    for context in contexts:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1, context), generator=generator).to(args.device)
        for mode in args.modes.split(","):
            config = TriForceConfig(retrieval_budget=args.budget, **MODES[mode])
            runs.append({"context": context, "mode": mode, "calls": calls_of(model, ids, config, args.new_tokens)})
    return {"command": " ".join(["python", *sys.argv]), "machine": machine_info(), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama3.1-8b", help="random-weights shape (hf_triforce shape presets)")
    parser.add_argument("--contexts", default="32768,131072", help="comma-separated prompt lengths")
    parser.add_argument("--modes", default="default,step", help="comma-separated: default, mean, step")
    parser.add_argument("--budget", type=int, default=4096, help="TriForceConfig.retrieval_budget")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output", default="phase-calls.json")
    parser.add_argument("--report", help="a JSON result to print as markdown")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return
    results = run(args)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(report(results))


if __name__ == "__main__":
    main()
