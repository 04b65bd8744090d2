"""Plain batched ``generate()`` against batched TriForce: decode throughput over the batch, same process.

Each row asks its own question about its own document (the four offline haystacks of
:mod:`~hf_triforce.bench.haystacks` in turn, or ``--document`` for every row); the prompts are
left-padded into one batch. Both sides are forced to ``new_tokens`` tokens per row (``min_new_tokens``), so every
row decodes the same number of tokens.

Decode time excludes the prefill: TriForce reports its own (``last_stats``: the call's seconds minus its prefill);
plain ``generate()`` with a batch cannot stream, so a stopping criterion that stops nothing (:class:`StepClock`)
notes when each of its steps ends, and its decode time runs from the first token to the last. Throughput is the
tokens after the first of every row per decode second.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from hf_triforce.bench.bandwidth import expected_tokens, kv_bytes_per_token, weight_bytes
from hf_triforce.bench.documents import question_prompt, read_document
from hf_triforce.bench.generate_kwargs import generate_kwargs
from hf_triforce.bench.haystacks import haystack_text
from hf_triforce.bench.machine import machine_info
from hf_triforce.bench.questions import DEFAULT_QUESTIONS
from hf_triforce.config import TriForceConfig
from hf_triforce.generation import last_stats
from hf_triforce.hf.linears import swapped_linears

from .memory_fit import H100_BYTES, largest_batch
from .shapes import preset_config

logger = logging.getLogger(__name__)

HAYSTACKS = ("reference", "code", "guide", "changelog")
"""The documents of the rows, in turn (each row also gets the next of ``DEFAULT_QUESTIONS``)."""


def batch_prompts(
    tokenizer, rows: int, document_tokens: int, document: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([rows, P] ids, [rows, P] mask)``: row ``b`` asks question ``b % 4`` about haystack ``b % 4`` (or about
    ``document``), ``document_tokens`` of it, left-padded with the tokenizer's pad id.

    Example:
        >>> ids, mask = batch_prompts(tokenizer, 4, 3500)  # doctest: +SKIP
        >>> ids.shape[0], int(mask.sum(1).min()) > 3500  # doctest: +SKIP
        (4, True)
    """
    prompts = []
    for b in range(rows):
        text = document if document is not None else haystack_text(HAYSTACKS[b % len(HAYSTACKS)])
        question = DEFAULT_QUESTIONS[b % len(DEFAULT_QUESTIONS)]
        prompts.append(question_prompt(tokenizer, text, question, document_tokens)[0])
    longest = max(p.shape[0] for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((rows, longest), pad, dtype=torch.long)
    mask = torch.zeros(rows, longest, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, longest - prompt.shape[0] :], mask[b, longest - prompt.shape[0] :] = prompt, 1
    return ids, mask


def compare_batch(
    model, ids, mask, config, new_tokens: int, temperature: float, top_p: float, seed: int = 0, warm_up: bool = False
) -> dict[str, Any]:
    """One plain/TriForce comparison on the ``[B, P]`` left-padded batch ``ids``/``mask``; a JSON-ready row.

    ``warm_up``: first run both on the batch untimed (4 tokens), as the first comparison of a sweep should.

    Example:
        >>> row = compare_batch(model, ids, mask, TriForceConfig(), 128, 0.0, 0.9, warm_up=True)  # doctest: +SKIP
        >>> row["throughput_ratio"], row["identical_output"]  # doctest: +SKIP
        (1.22, True)
    """
    kwargs = generate_kwargs(new_tokens, temperature, top_p, min_new_tokens=new_tokens)
    kwargs.update(attention_mask=mask.to(model.device), pad_token_id=int(ids[0, 0]))
    ids = ids.to(model.device)
    if warm_up:  # the first calls at a new cache size run slow on the CPU (the allocator): not timed
        _plain_decode(model, ids, seed, {**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        _timed(model, ids, seed, {**kwargs, "max_new_tokens": 4, "min_new_tokens": 4, "triforce_config": config})
    plain_decode, plain = _plain_decode(model, ids, seed, kwargs)
    with swapped_linears([model]):  # how much of the ratio hf_triforce's CPU linear path alone gives
        fast_decode, _ = _plain_decode(model, ids, seed, kwargs)
    triforce = _timed(model, ids, seed, {**kwargs, "triforce_config": config})
    stats = last_stats(model)
    decoded = ids.shape[0] * (new_tokens - 1)
    triforce_decode = stats.seconds - stats.prefill_seconds
    return {
        "batch_size": ids.shape[0],
        "prompt_tokens": mask.sum(dim=1).tolist(),
        "temperature": temperature,
        "budget": config.retrieval_budget,
        "drafter": config.drafter,
        "plain": {"decode_seconds": plain_decode, "tokens_per_second": decoded / plain_decode},
        "plain_fast_linears": {"decode_seconds": fast_decode, "tokens_per_second": decoded / fast_decode},
        "triforce_run": {"decode_seconds": triforce_decode, "tokens_per_second": decoded / triforce_decode},
        "throughput_ratio": plain_decode / triforce_decode,
        "identical_output": bool(torch.equal(plain, triforce)),
        "triforce": stats.to_dict(),
        "config": config.to_dict(),
    }


def _timed(model, ids, seed: int, kwargs: dict[str, Any]) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.inference_mode():
        return model.generate(ids, **kwargs)


class StepClock(StoppingCriteria):
    """A stopping criterion that stops nothing and notes when each decoding step of plain ``generate()`` ends."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _plain_decode(model, ids, seed: int, kwargs: dict[str, Any]) -> tuple[float, torch.Tensor]:
    """Plain batched ``generate()``: the seconds from its first token to its last (the decode), and its output."""
    clock = StepClock()
    out = _timed(model, ids, seed, {**kwargs, "stopping_criteria": StoppingCriteriaList([clock])})
    return clock.times[-1] - clock.times[0], out


def run_batch_benchmark(options, model, tokenizer, configs, command: str = "") -> dict[str, Any]:
    """Every ``(prompt length, temperature, config)`` of the sweep on a batch of ``options.batch_size`` rows.

    Args:
        options: the :class:`~hf_triforce.bench.run.BenchOptions` (``batch_size``, ``prompt_tokens``,
            ``temperatures``, ``new_tokens``, ``top_p``, ``seed``, ``document``).
        model: the TriForce-enabled target.
        tokenizer: its tokenizer (a batch of questions needs one).
        configs: the :class:`~hf_triforce.config.TriForceConfig` of each ``(budget, drafter)``.
        command: the command line, recorded.
    """
    document = read_document(options.document) if options.document else None
    grid = [(n, t, c) for n in options.prompt_tokens for t in options.temperatures for c in configs]
    rows = []
    for i, (tokens, temperature, config) in enumerate(tqdm(grid, desc="batch benchmark", unit="config")):
        ids, mask = batch_prompts(tokenizer, options.batch_size, int(tokens), document)
        row = compare_batch(
            model, ids, mask, config, options.new_tokens, temperature, options.top_p, options.seed, warm_up=i == 0
        )
        logger.info("batch %d, T=%s: throughput %.2fx", options.batch_size, temperature, row["throughput_ratio"])
        rows.append(row)
    return {"title": "plain batched generate() vs batched TriForce", "command": command, "machine": machine_info(),
            "batch_rows": rows}  # fmt: skip


def batch_table(results: dict[str, Any]) -> list[str]:
    """The markdown lines of a batch benchmark (``results["batch_rows"]``)."""
    lines = [
        "| batch | prompt tokens per row | T | drafter | budget | plain tok/s | TriForce tok/s | throughput ratio | "
        "identical | level-0 acc. per token | level-1 acc. per token (rows) | verifications / tokens | "
        "rounds 0->1->2 / 0->2 / plain | plain + fast linears tok/s |",
        "|---:|---|---:|---|---:|---:|---:|---:|---|---:|---|---:|---|---:|",
    ]
    for r in results["batch_rows"]:
        stats = r["triforce"]
        rows = ", ".join(f"{row['levels']['level1']['per_token_acceptance']:.2f}" for row in stats.get("rows", []))
        identical = ("yes" if r["identical_output"] else "NO") if r["temperature"] == 0 else "n/a"
        lines.append(
            f"| {r['batch_size']} | {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} | {r['temperature']} | "
            f"{r['drafter']} | {r['budget']} | {r['plain']['tokens_per_second']:.2f} | "
            f"{r['triforce_run']['tokens_per_second']:.2f} | {r['throughput_ratio']:.2f}x | {identical} | "
            f"{stats['levels']['level0']['per_token_acceptance']:.2f} | "
            f"{stats['levels']['level1']['per_token_acceptance']:.2f} ({rows}) | "
            f"{stats['target_forwards']} / {stats['new_tokens']} | {_rounds(stats)} | "
            f"{r['plain_fast_linears']['tokens_per_second']:.2f} |"
        )
    lines += [
        "",
        "Throughput = new tokens after the first of every row per decode second (prefill excluded), same process "
        "and batch; both forced to the same number of new tokens per row. Plain decode time: from its first token "
        "to its last, timed by a stopping criterion that stops nothing. Identical: every row equals plain batched "
        "generate() (T=0). Verifications: batched full-cache forwards, for all the rows' new tokens. The last "
        "column is plain batched generate() with hf_triforce's CPU linear path (hf_triforce.kernels.linear) "
        "switched on: the part of the ratio that path alone gives.",
    ]
    return lines


def _rounds(stats: dict[str, Any]) -> str:
    rounds = stats.get("rounds", {})
    return " / ".join(str(rounds.get(kind, 0)) for kind in ("levels", "level0", "plain"))


MODELED_BATCHES = (8, 16, 32)
MODELED_CONTEXTS = (32768, 65536, 131072)
ASSUMED_ACCEPTANCE = 0.9  # level-1 per-token acceptance when --real-acceptance gives none (TriForce: 0.91-0.92)


def modeled_batch_results(options, command: str = "") -> dict[str, Any]:
    """``--preset P --batch-size N``: the bandwidth model's figures for batches 8-32 (and N) at 32K-128K tokens per
    row, for each budget, with the largest batch that fits one 80 GB GPU (the memory model of
    :func:`~research.memory_fit.largest_batch`); nothing is run (labelled as modeled)."""
    config = preset_config(options.preset, 1)
    dtype_bytes = getattr(torch, options.dtype or "bfloat16").itemsize
    acceptance = options.real_acceptance if isinstance(options.real_acceptance, float) else ASSUMED_ACCEPTANCE
    gamma2 = options.gamma2 or TriForceConfig().gamma2
    rows = []
    for batch in sorted({*MODELED_BATCHES, options.batch_size}):
        for context in MODELED_CONTEXTS:
            for budget in options.budgets:
                figures = modeled_batch_speedup(config, dtype_bytes, batch, context, budget, acceptance, gamma2)
                tc = TriForceConfig(retrieval_budget=budget)
                fits = largest_batch(config, context, dtype_bytes, tc, H100_BYTES)
                rows.append({"batch_size": batch, "context": context, "budget": budget, "largest_batch_h100": fits,
                             **figures})  # fmt: skip
    title = f"batched TriForce, modeled: {options.preset}"
    figures = {"acceptance": acceptance, "gamma2": gamma2, "dtype_bytes": dtype_bytes}
    return {"title": title, "command": command, "machine": machine_info(), "modeled_batch_rows": rows, **figures}


def modeled_batch_table(results: dict[str, Any]) -> list[str]:
    """The markdown lines of :func:`modeled_batch_results`."""
    lines = [
        f"**Modeled, not measured** (bandwidth model, DESIGN.md section 5): level-1 per-token acceptance "
        f"{results['acceptance']}, gamma2 {results['gamma2']}, {results['dtype_bytes']}-byte weights and KV. A "
        "plain step reads the weights once and every row's KV; a level-1 step the weights and each row's view; a "
        "verification what a plain step reads.",
        "",
        "| batch | context per row | budget | KV share of a plain step | GB per plain step | GB per level-1 step | "
        "modeled speedup | largest batch on one 80 GB GPU |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["modeled_batch_rows"]:
        lines.append(
            f"| {r['batch_size']} | {r['context'] // 1024}K | {r['budget']} | {r['kv_share']:.2f} | "
            f"{r['plain_bytes'] / 1e9:.1f} | {r['level1_bytes'] / 1e9:.1f} | {r['speedup']:.2f}x | "
            f"{r['largest_batch_h100']} |"
        )
    return lines


def modeled_batch_speedup(
    config, dtype_bytes: int, batch: int, context: int, budget: int, acceptance: float, gamma2: int
) -> dict[str, float]:
    """Bandwidth-model figures of a batch: every step reads the weights once and each row's KV.

    A plain step reads ``weights + batch x context`` tokens of KV; a level-1 step ``weights + batch x budget``; a
    verification of ``gamma2 + 1`` tokens per row reads what a plain step reads (bandwidth bound: its extra
    compute is assumed hidden). A round of ``gamma2`` level-1 steps and one verification yields
    :func:`expected_tokens` per row. The KV share of a step grows with the batch, so speculation over a sparse
    view pays more with larger batches (MagicDec's observation).

    Returns:
        ``{"plain_bytes", "level1_bytes", "kv_share", "speedup"}`` (``kv_share``: KV bytes / all bytes of a
        plain step).

    Example:
        >>> from research.shapes import preset_config
        >>> figures = modeled_batch_speedup(preset_config("llama3.1-8b", 1), 2, 8, 32768, 4096, 0.9, 6)
        >>> round(figures["speedup"], 2), round(figures["kv_share"], 2)
        (1.52, 0.68)
    """
    kv = kv_bytes_per_token(config, dtype_bytes)
    weights = weight_bytes(config, dtype_bytes)
    plain = weights + batch * context * kv
    level1 = weights + batch * min(budget, context) * kv
    speedup = expected_tokens(acceptance, gamma2) * plain / (gamma2 * level1 + plain)
    return {"plain_bytes": plain, "level1_bytes": level1, "kv_share": batch * context * kv / plain, "speedup": speedup}
