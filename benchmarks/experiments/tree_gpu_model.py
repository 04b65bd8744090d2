"""Issue 53: token trees on the GPU shapes, modeled from recorded H200 latencies and real-text acceptance.

No GPU was lent to the session that wrote this, so the verification's cost by width is *modeled*: the recorded
H200 forward of 7 tokens (``benchmarks/results/h200-llama3.1-8b.md``, ``h200-llama2-7b.md``, random weights, bf16)
plus, per extra token, its arithmetic (2 FLOPs per weight, and attention's 4 FLOPs per cached key and head
dimension) at a stated fraction of the H200's dense bf16 peak (989 TFLOP/s). A level-1 forward of ``w`` tree
nodes costs the recorded level-1 step plus the same per-token arithmetic over the view. The positional acceptance
vector ``p_k`` is what SmolLM2 measured on the bench's natural prompts at 7K on the CPU (``stats
.positional_acceptance`` of a ``hf-triforce bench --tree-budgets`` record, pooled per temperature).

For each shape it prints the best chain (length 1..gamma2) and the best tree of 8..128 nodes (depth up to 12, by
Sequoia's program), with expected tokens per verification and modeled ms per token, beside the plain bandwidth
floor, for two level-1 costs: the CUDA-graph step (what trees would cost with fixed-shape tree steps, which do not
exist yet) and the eager dynamic step (what level 1 costs under trees today: they need dynamic shapes).

Run: ``.venv/bin/python benchmarks/experiments/tree_gpu_model.py
benchmarks/results/token-trees-7k/cpu-smollm2-7k-trees.json --output
benchmarks/results/token-trees-7k/gpu-model.md``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_triforce.hierarchy.planner import tree_widths
from hf_triforce.hierarchy.tree_shape import MAX_BRANCH, PositionalAcceptance, best_tree, chain

PEAK_FLOPS = 989e12  # H200 dense bf16
BANDWIDTH = 4.8e12  # H200 HBM3e, bytes/s
SIZES = (8, 16, 32, 64, 128)
MAX_DEPTH = 12
GAMMA2 = 6

# Recorded on an H200 (random weights, bf16; cuda_graphs=auto unless named): ms of one call.
SHAPES = {
    "llama3.1-8b 128K": dict(
        params=8.03e9,
        layers=32,
        heads=32,
        head_dim=128,
        context=131072,
        view=4096,
        weights_mib=15317,
        kv_mib=16401,
        verify7=30.8,
        level1_graph=10.4,
        level1_eager=23.8,
        refresh=10.3,
        source="h200-llama3.1-8b.md (verification, graph step, refresh); h200-stacked-llama3.1-8b-direct.md "
        "(eager step)",
    ),
    "llama3.1-8b 32K": dict(
        params=8.03e9,
        layers=32,
        heads=32,
        head_dim=128,
        context=32768,
        view=4096,
        weights_mib=15317,
        kv_mib=4113,
        verify7=48.2,
        level1_graph=10.5,
        level1_eager=23.8,
        refresh=62.9,
        source="h200-llama3.1-8b.md (the 32K row; eager step: the 128K one)",
    ),
    "llama2-7b 64K": dict(
        params=6.74e9,
        layers=32,
        heads=32,
        head_dim=128,
        context=65536,
        view=4096,
        weights_mib=12853,
        kv_mib=32836,
        verify7=35.5,
        level1_graph=7.7,
        level1_eager=None,
        refresh=13.5,
        source="h200-llama2-7b.md (no eager step recorded)",
    ),
}


def per_token_ms(shape: dict, keys: int, efficiency: float) -> float:
    """Arithmetic of one more query token: the weights' 2 FLOPs each, attention's 4 per key and head dimension."""
    flops = 2 * shape["params"] + 4 * shape["layers"] * shape["heads"] * shape["head_dim"] * keys
    return 1e3 * flops / (PEAK_FLOPS * efficiency)


def round_ms(shape: dict, widths: list[int], verified: int, level1: float, efficiency: float) -> float:
    """A round: level 1's forwards (``widths``), one verification of ``verified`` tokens, a refresh's share."""
    extra = per_token_ms(shape, shape["context"], efficiency)
    view = per_token_ms(shape, shape["view"], efficiency)
    steps = sum(level1 + (w - 1) * view for w in widths)
    return steps + shape["verify7"] + (verified - 7) * extra + shape["refresh"] / 4  # a refresh every ~4 rounds


def vector(paths: list[str], temperature: float) -> list[float]:
    """The pooled positional acceptance of every row at ``temperature`` in the bench records ``paths``."""
    pooled = PositionalAcceptance(prior_first=0.8)
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            if row["temperature"] != temperature:
                continue
            counts = row["triforce"]["triforce"].get("positional_acceptance") or {}
            trials_by_rank = list(counts.get("trials", []))
            if temperature == 0 and row.get("tree_budget") == 0 and trials_by_rank:
                # greedy chains: every node is a trial for every rank (records made before that fix counted the
                # rounds that missed only for ranks >= 2, which over-states p_k there)
                trials_by_rank = [trials_by_rank[0]] * len(trials_by_rank)
            for k, (trials, accepted) in enumerate(zip(trials_by_rank, counts.get("accepted", []), strict=False)):
                while len(pooled.trials) <= k:
                    pooled.trials.append(0.0)
                    pooled.successes.append(0.0)
                pooled.trials[k] += trials
                pooled.successes[k] += accepted
    return pooled.vector(MAX_BRANCH)


def model(shape: dict, p: list[float], efficiency: float, level1: float) -> list[tuple[str, float, float]]:
    """``(schedule, tokens per verification, ms per token)`` of the best chain and the best tree of each size."""

    def per_token(t) -> float:  # level 1's forwards as wide as each depth's parents (a chain's: one token each)
        return round_ms(shape, tree_widths(t), t.size, level1, efficiency) / t.expected_tokens

    best_chain = min((chain(g, p) for g in range(1, GAMMA2 + 1)), key=per_token)
    rows = [(f"chain of {best_chain.depth}", best_chain.expected_tokens, per_token(best_chain))]
    for size in SIZES:
        tree = min((best_tree(p, size, d) for d in range(1, MAX_DEPTH + 1)), key=per_token)
        rows.append((f"tree of {tree.size}, depth {tree.depth}", tree.expected_tokens, per_token(tree)))
    return rows


def report(paths: list[str], efficiency: float) -> str:
    lines = ["# Token trees on the GPU shapes: modeled", ""]
    for temperature in (0.0, 0.6):
        p = vector(paths, temperature)
        lines += [
            f"## T={temperature:g}: p_k = {', '.join(f'{x:.3f}' for x in p[:5])} (SmolLM2, 7K, natural prompts)",
            "",
        ]
        for name, shape in SHAPES.items():
            floor = (shape["weights_mib"] + shape["kv_mib"]) * 2**20 / BANDWIDTH * 1e3
            lines += [f"### {name} (plain floor {floor:.1f} ms/token; {shape['source']})", ""]
            header = "| schedule | tokens / verification | ms/token, graph level 1 | x floor | ms/token, eager level 1 "
            lines += [header + "(trees today) | x floor |", "|---|---:|---:|---:|---:|---:|"]
            graph = model(shape, p, efficiency, shape["level1_graph"])
            eager = model(shape, p, efficiency, shape["level1_eager"]) if shape["level1_eager"] else None
            for i, (label, tokens, ms) in enumerate(graph):
                e = "-" if eager is None else f"{eager[i][2]:.1f}"
                ef = "-" if eager is None else f"{eager[i][2] / floor:.2f}"
                lines.append(f"| {label} | {tokens:.2f} | {ms:.1f} | {ms / floor:.2f} | {e} | {ef} |")
            lines.append("")
    lines.append(
        f"Arithmetic per extra token at {efficiency:.0%} of the H200's dense bf16 peak; a refresh every 4 rounds."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="hf-triforce bench JSON records with positional_acceptance")
    parser.add_argument("--efficiency", type=float, default=0.5, help="fraction of peak FLOP/s (default 0.5)")
    parser.add_argument("--output", help="write the markdown here")
    args = parser.parse_args()
    text = report(args.records, args.efficiency)
    if args.output:
        Path(args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
