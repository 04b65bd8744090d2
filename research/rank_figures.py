"""Each rank's own figures of a tensor-parallel benchmark (``bench --tp N``), gathered for rank 0's report.

Every rank runs the same rows (same prompt, same seed) on its shard of the weights and measures its own decode
latencies and cache sizes (:func:`rank_figures`); :func:`gather_rank_figures` collects them on every rank (one
``all_gather_object`` of a few small dicts per row, after the timed runs) and :func:`attach_rank_figures` adds
them to the results, with whether every rank produced the same text, which rank 0 then writes
(:func:`is_report_rank`); :func:`end_ranks` ends the process group once every rank is done.

Example:
    >>> same_text([{"plain_new_tokens": [1, 2], "triforce_new_tokens": [1, 2]}] * 2)
    True
"""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from hf_triforce.bench.comparison import Comparison

from .lab_report import phase_ms

logger = logging.getLogger(__name__)

TOKENS = ("plain_new_tokens", "triforce_new_tokens")
"""The per-rank entries that only serve to compare the ranks' outputs (dropped from the written figures)."""


def is_report_rank() -> bool:
    """Whether this process writes the report: rank 0 of a tensor-parallel run, or the only process.

    Example:
        >>> is_report_rank()  # no process group: the only process
        True
    """
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def end_ranks() -> None:
    """End a tensor-parallel benchmark's process group once every rank is done (rank 0 with its report).

    Each rank waits at a barrier, then destroys the group, so no rank exits with the group still alive (torch's
    NCCL warns of leaked resources then, and a gloo rank can abort at interpreter teardown). Nothing to do without
    a process group.

    Example:
        >>> end_ranks()  # no process group: a no-op
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def rank_figures(comparison: Comparison, prompt_tokens: int) -> dict[str, Any]:
    """This rank's figures of one row: decode ms/token of both runs, step latencies, cache bytes, new tokens.

    Example:
        >>> rank_figures(compare(model, ids, TriForceConfig(), max_new_tokens=8), ids.shape[1])  # doctest: +SKIP
        {'rank': 1, 'plain_ms_per_token': 2.1, ..., 'full_cache_bytes': 36864, 'view_bytes': 16384, ...}
    """
    stats = comparison.triforce.stats or {}
    phases = stats.get("phases", {})
    return {
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "plain_ms_per_token": 1e3 * comparison.plain.decode_seconds_per_token,
        "triforce_ms_per_token": 1e3 * comparison.triforce.decode_seconds_per_token,
        "speedup": comparison.speedup,
        "level1_step_ms": phase_ms(phases.get("level1")),
        "verification_ms": phase_ms(phases.get("level2")),
        "full_cache_bytes": stats.get("full_cache_bytes"),
        "view_bytes": stats.get("view_bytes"),
        "identical_output": comparison.identical,
        "plain_new_tokens": comparison.plain.sequences[0, prompt_tokens:].tolist(),
        "triforce_new_tokens": comparison.triforce.sequences[0, prompt_tokens:].tolist(),
    }


def gather_rank_figures(own: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``[row][rank]``: every rank's :func:`rank_figures` of every row, on every rank (a collective: all call it).

    Example:
        >>> gather_rank_figures([{"rank": 0}])  # one process: its own figures only
        [[{'rank': 0}]]
    """
    if not dist.is_initialized():
        return [[figures] for figures in own]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, own)
    return [[ranks[row] for ranks in everyone] for row in range(len(own))]


def same_text(ranks: list[dict[str, Any]]) -> bool:
    """Whether every rank generated the same tokens, plain and with TriForce."""
    return all(all(r[key] == ranks[0][key] for r in ranks) for key in TOKENS)


def attach_rank_figures(results: dict[str, Any], per_row: list[list[dict[str, Any]]], kv_heads: int) -> None:
    """Add to ``results`` each row's per-rank figures and ``same_text_on_all_ranks``, and the run's
    ``tensor_parallel`` facts (ranks, backend, KV heads per rank); logs an error when the ranks' texts differ.

    Example:
        >>> attach_rank_figures(results, gather_rank_figures(own), kv_heads=8)  # doctest: +SKIP
        >>> results["tensor_parallel"]["kv_heads_per_rank"]  # doctest: +SKIP
        4
    """
    for row, ranks in zip(results["rows"], per_row, strict=True):
        row["same_text_on_all_ranks"] = same_text(ranks)
        row["ranks"] = [{k: v for k, v in r.items() if k not in TOKENS} for r in ranks]
        if not row["same_text_on_all_ranks"]:
            logger.error(
                "prompt %s, T=%s: the ranks generated different texts", row["prompt_tokens"], row["temperature"]
            )
    world = len(per_row[0]) if per_row else 1
    results["tensor_parallel"] = {
        "ranks": world,
        "backend": str(dist.get_backend()) if dist.is_initialized() else None,
        "kv_heads": kv_heads,
        "kv_heads_per_rank": kv_heads // world,
        "bytes_per_rank": f"1/{world} of a single-process run's full-cache and view bytes (each rank caches its "
        f"{kv_heads // world} of the {kv_heads} KV heads)",
        "same_text_on_all_ranks": all(row["same_text_on_all_ranks"] for row in results["rows"]),
    }
