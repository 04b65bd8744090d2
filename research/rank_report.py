"""The per-rank section of a tensor-parallel benchmark's markdown report (``python -m research.lab_bench --tp N``).

Example:
    >>> rank_section({"rows": []})  # not a tensor-parallel run: no section
    []
"""

from __future__ import annotations

from typing import Any

from hf_triforce.bench.formatting import number


def rank_section(results: dict[str, Any]) -> list[str]:
    """Markdown lines: the ranks, their backend, and one table line per rank of every row (``results["rows"]``
    with ``row["ranks"]``, as :func:`~.rank_figures.attach_rank_figures` left them); none without ``--tp``.

    Example:
        >>> print("\\n".join(rank_section(run_benchmark(BenchOptions(tp=2)))))  # doctest: +SKIP
        ## Tensor parallelism: 2 ranks (gloo)
        ...
    """
    tp = results.get("tensor_parallel")
    if tp is None:
        return []
    n = tp["ranks"]
    same = "yes" if tp["same_text_on_all_ranks"] else "NO"
    lines = [
        "",
        f"## Tensor parallelism: {n} ranks ({tp['backend']})",
        "",
        f"Every rank ran every row on its shard of the weights (the model's tp_plan), with the same prompt and "
        f"seed, and measured its own timings and cache sizes; the tables above are rank 0's. Each rank caches "
        f"{tp['kv_heads_per_rank']} of the model's {tp['kv_heads']} KV heads, so its full-cache and view bytes "
        f"are 1/{n} of a single-process run's; the weights, KV bytes per token and bandwidth floors above are "
        f"rank 0's share too, and the CPU linear fast-path reference (plain + fast linears) is not measured. "
        f"Same text on all ranks: {same}.",
        "",
        "| prompt | T | rank | plain ms/token | TriForce ms/token | speedup | level-1 step ms | verification ms | "
        "full-cache bytes | view bytes | same text on all ranks |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in results["rows"]:
        lines += [_rank_line(row, figures) for figures in row["ranks"]]
    return lines


def _rank_line(row: dict[str, Any], r: dict[str, Any]) -> str:
    same = "yes" if row["same_text_on_all_ranks"] else "NO"
    cells = [
        row["prompt_tokens"],
        row["temperature"],
        r["rank"],
        number(r["plain_ms_per_token"], 1),
        number(r["triforce_ms_per_token"], 1),
        f"{number(r['speedup'], 2)}x",
        number(r["level1_step_ms"], 1),
        number(r["verification_ms"], 1),
        r["full_cache_bytes"],
        r["view_bytes"],
        same,
    ]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"
