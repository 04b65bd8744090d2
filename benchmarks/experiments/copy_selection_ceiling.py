"""How far can better chunk scoring lift level-1 acceptance on the copy tasks? (issue 18)

For every task of a copy-task split (``hf_triforce.evaluation.drafts.copy_tasks``: 4 passage kinds x 5 depths,
6K-token prompts, T=0), the prompt is prefilled once, the full model's own answer decoded (64 tokens), and
level 1 replayed along it (rounds of gamma2 = 6, re-selection every 4 cached tokens, as ``eval-drafts`` does) with
several chunk-scoring rules. Reported: per-token acceptance (accepted / (accepted + rejections)) per depth.

Rules (all with the package's ``select_token_indices``: sink chunk, recent window 64, ``lookahead`` chunks; the
``package-xN`` rules take the config's window, ``'auto'`` since 2026-11-27: a quarter of the budget):

* ``sum-wN``: the package's rule (query . chunk-mean key, summed over the GQA group), over the last N queries;
* ``softmax-wN`` / ``max-w1`` / ``softmaxmax-w8``: other ways to combine a group's heads and N recent queries;
* ``package-xN``: the package's selection itself (``eval-drafts``' ``select_indices``) with
  ``rescore_candidates=N`` (``package-x0`` is ``base-sum-w1``);
* ``two-stage-xN-*``: the same idea as ``rescore_candidates=N`` written out here (it nominates
  ``N * (budget - CHUNK - WINDOW) / CHUNK`` chunks; the package subtracts the exact recent span, so it may
  nominate one fewer), with three ways to rank the nominated chunks;
* ``package-xN-wW`` / ``package-xN-bF``: the package's selection with ``rescore_candidates=N`` and a recent window
  of ``W`` tokens / ``budget // F`` (whole chunks); ``streaming``: StreamingLLM of the same budget (8 sinks);
* ``leadN``: the package's selection (``rescore_candidates=4``, the ``"auto"`` window) where only the ``N`` best chunks
  bring the chunk after them (``lookahead_chunks=1`` lets every chosen chunk do so; ``lead0`` is plain top-k);
* ``mqN`` / ``mqnN``: the package's selection (``rescore_candidates=4``, the ``"auto"`` window) where the nominees are
  ranked by their largest logit over the last ``N`` positions' queries (``mqr``: the positions the last round kept, the
  queries level 1 holds after a verification), and with ``mqn`` nominated by those queries' summed mean-key scores too;
* ``stream-first-N`` / ``stream-last-N``: the package's selection in every layer but the first / last ``N``, which keep
  StreamingLLM's tokens (the sink chunk, one retrieved chunk, a window of ``budget - 16``);
* ``package-xN-cC-aA``: the package's selection with ``rescore_candidates=N``, chunks of ``C`` tokens (mean keys from
  the cache's keys) and ``lookahead_chunks=A``;
* ``exact-*``: the keys themselves, not their chunk means: ``mass`` is the attention the full cache gives each
  chunk (softmax over every key), ``peak`` the largest token logit in the chunk, ``peakprob`` its largest
  probability. These are the ceiling of chunk-mean scoring for the same queries.

``--natural N`` adds ``eval-drafts``' N natural continuations of the language reference and ``--genres N`` N raw
slices of each haystack (``step_selection_ab.tasks``; ``--split ''`` for natural text alone), reported pooled and
per prompt; ``--budgets`` picks the view budgets (tokens).

Run: ``.venv/bin/python benchmarks/experiments/copy_selection_ceiling.py --split tune --output X.json``
(about 25 minutes per 10 rules on 2 CPU threads); ``--report X.json [Y.json ...]`` rewrites the markdown table of
recorded runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import shlex
import sys
import time

import torch
from step_selection_ab import tasks as prompt_tasks  # benchmarks/: the script's own folder

from hf_triforce import TriForceConfig
from hf_triforce.caches.selection import chunk_layout, rescore, select_token_indices
from hf_triforce.evaluation.common.loading import load_model
from hf_triforce.evaluation.common.machine import machine_info
from hf_triforce.evaluation.drafts.acceptance import acceptance
from hf_triforce.evaluation.drafts.level1 import replay_round
from hf_triforce.evaluation.drafts.reference import Prefill, decode_reference, new_cache
from hf_triforce.evaluation.drafts.summary import margin_interval
from hf_triforce.evaluation.drafts.view_forward import DEFAULT_MAX_ROWS, view_logits
from hf_triforce.evaluation.drafts.view_policy import ViewPolicy, group_scores, select_indices
from hf_triforce.hf.attention import QueryCapture, capturing_queries
from hf_triforce.hf.linears import small_batch_linears
from hf_triforce.hf.model import eos_token_ids
from hf_triforce.hf.versions import cache_kwargs
from hf_triforce.stats import LevelStats

K = 32  # prompt-tail queries kept for the multi-query rules
CTX, NEW, CHUNK, WINDOW, BUDGETS = 6144, 64, 8, 64, (384, 768)


def prefill(model, ids):
    """Full cache of ``ids`` ``[1, n]``, the last step, and the last K positions' queries ``[L, K, H_q, D]``."""
    n = ids.shape[1]
    cache = new_cache(model, n + NEW + 8)
    cap = QueryCapture()
    with torch.inference_mode(), small_batch_linears(model), capturing_queries(model, cap, keep=K) as kw:
        out = model(input_ids=ids, position_ids=torch.arange(n)[None], **cache_kwargs(cache), use_cache=True,
                    logits_to_keep=1, **kw)  # fmt: skip
    tail = torch.stack([cap.queries[i][0].transpose(0, 1) for i in sorted(cap.queries)])
    return cache, Prefill(ids[0], out.logits[0, -1].float(), tail[:, -1]), tail


def summary_scores(queries, summaries, rule):
    """``queries`` ``[W, H_q, D]``, ``summaries`` ``[1, H_kv, C, D]`` -> ``[1, H_kv, C]``."""
    w, hq, d = queries.shape
    hkv = summaries.shape[1]
    per = torch.einsum("whgd,hcd->whgc", queries.reshape(w, hkv, hq // hkv, d).to(summaries.dtype), summaries[0])
    if rule == "sum":
        return per.sum(dim=2).sum(0)[None]
    if rule == "softmax":
        return (per / math.sqrt(d)).softmax(-1).sum(dim=2).sum(0)[None]
    if rule == "max":
        return per.amax(dim=2).sum(0)[None]
    return (per / math.sqrt(d)).softmax(-1).amax(dim=2).sum(0)[None]  # softmax-max


def key_scores(queries, keys, rule):
    """``queries`` ``[W, H_q, D]``, ``keys`` ``[1, H_kv, C * CHUNK, D]`` -> ``[1, H_kv, C]``."""
    w, hq, d = queries.shape
    hkv, length = keys.shape[1], keys.shape[2]
    g = queries.reshape(w, hkv, hq // hkv, d).to(keys.dtype)
    logits = torch.einsum("whgd,hld->whgl", g, keys[0]) / math.sqrt(d)
    chunks = (w, hkv, hq // hkv, length // CHUNK, CHUNK)
    if rule == "mass":
        return logits.softmax(-1).reshape(chunks).sum(-1).sum(dim=2).sum(0)[None]
    if rule == "peak":
        return logits.reshape(chunks).amax(-1).amax(2).sum(0)[None]
    return logits.softmax(-1).reshape(chunks).amax(-1).sum(dim=2).sum(0)[None]  # peakprob


def two_stage(rule, factor, lookahead=1, window=WINDOW):
    """Chunk-mean scores pick ``factor`` x as many chunks as the budget holds; ``key_scores`` ranks those.
    ``window``: recent tokens (``"auto"``: a quarter of the budget, whole chunks, the config's default)."""

    def select(cache, history, length, budget):
        indices = []
        recent = TriForceConfig(retrieval_budget=budget).recent_tokens if window == "auto" else window
        k = max(1, (budget - CHUNK - recent) // CHUNK)
        for layer, queries in zip(cache.layers, history, strict=True):
            coarse = summary_scores(queries[-1:], layer.summaries()[:, :, : length // CHUNK], "sum")
            n = coarse.shape[-1]
            keep = coarse[:, :, 1:].topk(min(n - 1, factor * k), dim=-1).indices + 1  # [1, H_kv, F] (not the sink)
            tokens = (keep[..., None] * CHUNK + torch.arange(CHUNK)).flatten(2)  # [1, H_kv, F * CHUNK]
            keys = layer.buffer.keys.gather(2, tokens[..., None].expand(-1, -1, -1, layer.buffer.keys.shape[-1]))
            fine = key_scores(queries[-1:], keys, rule)  # [1, H_kv, F]
            scores = torch.full_like(coarse, float("-inf")).scatter(-1, keep, fine.to(coarse.dtype))
            indices.append(select_token_indices(scores, length, CHUNK, budget, recent, lookahead))
        return indices

    return select


def selector(rule, window, lookahead=1, exact=False):
    def select(cache, history, length, budget):
        indices = []
        for layer, queries in zip(cache.layers, history, strict=True):
            if exact:
                scores = key_scores(queries[-window:], layer.buffer.keys[:, :, : length // CHUNK * CHUNK], rule)
            else:
                scores = summary_scores(queries[-window:], layer.summaries()[:, :, : length // CHUNK], rule)
            indices.append(select_token_indices(scores, length, CHUNK, budget, WINDOW, lookahead))
        return indices

    return select


def newest(history):
    """Per-layer ``[1, H_q, D]`` query of the newest cached token, from per-layer ``[T, H_q, D]`` ``history``."""
    return [queries[-1][None] for queries in history]


def package(rescore_candidates, recent_window="auto", chunk_size=CHUNK, lookahead=1):
    """The package's own selection (as ``eval-drafts`` runs it) with ``TriForceConfig.rescore_candidates``,
    ``recent_window`` (``"auto"``: the config's; an int, or ``"bN"``: ``budget // N`` in whole chunks), chunks of
    ``chunk_size`` tokens (other than the cache's: mean keys computed from its keys) and ``lookahead_chunks``."""

    def select(cache, history, length, budget):
        window = recent_window
        if isinstance(window, str) and window.startswith("b"):
            window = budget // int(window[1:]) // chunk_size * chunk_size
        policy = ViewPolicy(budget=budget, rescore_candidates=rescore_candidates, recent_window=window,
                            chunk_size=chunk_size, lookahead_chunks=lookahead)  # fmt: skip
        return select_indices(cache, newest(history), length, policy)

    return select


def leaders(count):
    """The package's selection (``rescore_candidates=4``, the ``"auto"`` window) where only the ``count`` best chunks
    bring the chunk after them (``lookahead_chunks=1`` lets every chosen chunk do so; ``count=0`` is plain top-k)."""

    def select(cache, history, length, budget):
        window = TriForceConfig(retrieval_budget=budget).recent_tokens
        candidates = chunk_layout(length, CHUNK, budget, window)[1]
        indices = []
        for layer, queries in zip(cache.layers, history, strict=True):
            query = queries[-1][None]
            scores = group_scores(query, layer.summaries()[:, :, : length // CHUNK], "sum")
            scores = rescore(scores, query, layer.buffer.keys, length, CHUNK, budget, window, 4)
            if count:
                middle = scores[:, :, 1 : 1 + candidates]
                floor = middle.topk(min(count, candidates), dim=-1).values[..., -1:]
                lead = torch.where(middle >= floor, middle, torch.full_like(middle, float("-inf")))
                scores = scores.clone()
                scores[:, :, 2 : 1 + candidates] = torch.maximum(middle[..., 1:], lead[..., :-1])
            indices.append(select_token_indices(scores, length, CHUNK, budget, window, 0))
        return indices

    return select


def positions_as_heads(queries):
    """``[M, H_q, D]`` queries of M positions -> ``[1, H_q * M, D]``, each query head's M together: the layout
    ``QueryCapture.upto`` gives level 1 and ``RetrievalCache.chunk_ranking`` takes (a GQA group's summaries sum over
    its heads' positions, its keys take the largest logit of any)."""
    return queries.transpose(0, 1).reshape(1, -1, queries.shape[-1])


LAST_KEEP = [1]  # positions the last replayed round kept (its accepted drafts and the full model's token)


def multi_query(count, nominate_all=False):
    """The package's selection (``rescore_candidates=4``, the ``"auto"`` window) where the nominees are ranked by their
    largest logit over the last ``count`` positions' queries (the newest cached token and those before it), not the
    newest one's alone; ``nominate_all``: the mean keys nominate with those queries' summed scores too. ``count=0``:
    the positions the last round kept (the queries of the tokens the last verification accepted, as level 1 holds
    them)."""

    def select(cache, history, length, budget):
        window = TriForceConfig(retrieval_budget=budget).recent_tokens
        indices = []
        for layer, queries in zip(cache.layers, history, strict=True):
            several = positions_as_heads(queries[-(count or LAST_KEEP[0]) :])
            summaries = layer.summaries()[:, :, : length // CHUNK]
            scores = group_scores(several if nominate_all else queries[-1][None], summaries, "sum")
            scores = rescore(scores, several, layer.buffer.keys, length, CHUNK, budget, window, 4)
            indices.append(select_token_indices(scores, length, CHUNK, budget, window, 1))
        return indices

    return select


def retrieval_and_streaming(cache, history, length, budget):
    """Per-layer indices of the package's selection (``rescore_candidates=4``, the ``"auto"`` window) and of
    StreamingLLM's tokens as a retrieval view holds them (the sink chunk, one retrieved chunk and a window of
    ``budget - 16``: as many tokens as the retrieval view, so the two can be mixed layer by layer or head by head)."""
    queries = newest(history)
    chosen = select_indices(cache, queries, length, ViewPolicy(budget=budget, rescore_candidates=4))
    stream = select_indices(cache, queries, length,
                            ViewPolicy(budget=budget, rescore_candidates=4, recent_window=budget - 16))  # fmt: skip
    return chosen, stream


def layer_split(count, first=True):
    """The package's selection (``rescore_candidates=4``, the ``"auto"`` window) in every layer but the first (or,
    ``first=False``, the last) ``count``, which keep StreamingLLM's tokens instead: the sink chunk, one retrieved chunk
    and a window of ``budget - 16`` (the same number of tokens as the retrieval view, so every layer holds as many)."""

    def select(cache, history, length, budget):
        chosen, stream = retrieval_and_streaming(cache, history, length, budget)
        n = len(chosen)
        local = range(count) if first else range(n - count, n)
        return [stream[i] if i in local else chosen[i] for i in range(n)]

    return select


def covered(queries, keys, indices):
    """``[H_kv]`` attention a view of ``indices`` ``[1, H_kv, S]`` keeps for ``queries`` ``[M, H_q, D]``: the logsumexp
    of its logits, summed over the positions and a KV head's query heads (the larger, the more of the full cache's
    softmax mass the view holds; both views compared are subsets of the same cache)."""
    m, hq, d = queries.shape
    hkv = keys.shape[1]
    kept = keys[0].gather(1, indices[0][..., None].expand(-1, -1, d))  # [H_kv, S, D]
    logits = torch.einsum("mhgd,hsd->mhgs", queries.reshape(m, hkv, hq // hkv, d).to(kept.dtype), kept)
    return (logits / math.sqrt(d)).logsumexp(-1).sum(dim=(0, 2))


def head_pick(count):
    """Per layer and KV head, the package's selection (``rescore_candidates=4``, the ``"auto"`` window) or
    StreamingLLM's tokens (the sink chunk, one retrieved chunk, a window of ``budget - 16``), whichever
    :func:`covered` finds holds more attention for the last ``count`` positions' queries (DuoAttention's retrieval and
    streaming heads, told apart at each refresh)."""

    def select(cache, history, length, budget):
        chosen, stream = retrieval_and_streaming(cache, history, length, budget)
        out = []
        for layer, queries, a, b in zip(cache.layers, history, chosen, stream, strict=True):
            keys = layer.buffer.keys
            pick = covered(queries[-count:], keys, b) > covered(queries[-count:], keys, a)  # [H_kv]
            out.append(torch.where(pick[None, :, None], b, a))
        return out

    return select


def streaming(cache, history, length, budget):
    """StreamingLLM of the same budget (8 sinks, the most recent tokens), as ``eval-drafts`` compares it."""
    return select_indices(cache, newest(history), length, ViewPolicy(kind="streaming", budget=budget))


def rule(name):
    """:data:`RULES`' entry, or ``package-xN-wW`` / ``package-xN-bF``: ``package(N, W)`` / ``package(N, "bF")``,
    ``package-xN-cC-aA``: ``package(N, chunk_size=C, lookahead=A)``, ``stream-first-N`` / ``stream-last-N``:
    :func:`layer_split`."""
    if name in RULES:
        return RULES[name]
    sized = re.fullmatch(r"package-x(\d+)-c(\d+)-a(\d+)", name)
    if sized:
        x, chunk_size, lookahead = (int(v) for v in sized.groups())
        return package(x, chunk_size=chunk_size, lookahead=lookahead)
    split = re.fullmatch(r"stream-(first|last)-(\d+)", name)
    if split:
        return layer_split(int(split.group(2)), split.group(1) == "first")
    match = re.fullmatch(r"package-x(\d+)-(w|b)(\d+)", name)
    if not match:
        raise SystemExit(
            f"unknown rule {name!r}: one of {sorted(RULES)}, package-xN-wW / package-xN-bF, "
            "package-xN-cC-aA or stream-first-N / stream-last-N"
        )
    x, unit, value = match.groups()
    return package(int(x), int(value) if unit == "w" else f"b{value}")


RULES = {
    "package-x0": package(0),
    "package-x4": package(4),
    "streaming": streaming,
    "lead0": leaders(0),
    "lead2": leaders(2),
    "lead4": leaders(4),
    "lead8": leaders(8),
    "lead16": leaders(16),
    "mq1": multi_query(1),
    "mq2": multi_query(2),
    "mq4": multi_query(4),
    "mq7": multi_query(7),
    "mqn4": multi_query(4, True),
    "mqn7": multi_query(7, True),
    "headpick1": head_pick(1),
    "headpick4": head_pick(4),
    "mqr": multi_query(0),
    "mqnr": multi_query(0, True),
    "base-sum-w1": selector("sum", 1),
    "softmax-w1": selector("softmax", 1),
    "max-w1": selector("max", 1),
    "sum-w8": selector("sum", 8),
    "softmax-w4": selector("softmax", 4),
    "softmax-w8": selector("softmax", 8),
    "softmax-w16": selector("softmax", 16),
    "softmax-w32": selector("softmax", 32),
    "softmaxmax-w8": selector("softmax-max", 8),
    "softmax-w8-a2": selector("softmax", 8, 2),
    "exact-mass-w1": selector("mass", 1, exact=True),
    "exact-peak-w1": selector("peak", 1, exact=True),
    "exact-peakprob-w1": selector("peakprob", 1, exact=True),
    "exact-mass-w8": selector("mass", 8, exact=True),
    "exact-mass-w1-a0": selector("mass", 1, 0, exact=True),
    "two-stage-x2-peak": two_stage("peak", 2),
    "two-stage-x4-peak": two_stage("peak", 4),
    "two-stage-x4-mass": two_stage("mass", 4),
    "two-stage-x4-peakprob": two_stage("peakprob", 4),
    "two-stage-x4-peak-auto": two_stage("peak", 4, window="auto"),
    "two-stage-x4-mass-auto": two_stage("mass", 4, window="auto"),
    "two-stage-x4-peakprob-auto": two_stage("peakprob", 4, window="auto"),
}


def replay(model, cache, ref, tail, select, budget, gamma2=6, refresh_every=4):
    """Level-1 rounds along ``ref`` with ``select``; returns (accepted, rejections)."""
    n, m = ref.prompt_length, ref.tokens.shape[0]
    history = torch.cat([tail[:, :-1], ref.queries], dim=1)  # index K - 1 + j: the query of position n - 1 + j
    coins, rounds = torch.Generator().manual_seed(0), LevelStats()
    selection, selected_at, j = None, 0, 1
    LAST_KEEP[0] = 1
    while j < m:
        length = n + j - 1
        if selection is None or length - selected_at >= refresh_every:
            selection, selected_at = select(cache, [h[: K - 1 + j] for h in history], length, budget), length
        stop = min(m, j + gamma2 + 1)
        lengths = torch.arange(n + j - 1, n + stop - 1)
        logits = view_logits(model, cache, selection, selected_at, lengths, ref.tokens[j - 1 : stop - 1],
                             DEFAULT_MAX_ROWS)  # fmt: skip
        done = replay_round(acceptance(ref.logits[j:stop], logits, 0.0, 1.0), min(gamma2, m - j - 1), 0.0, coins)
        rounds.record(done.drafted, done.accepted)
        j += done.keep
        LAST_KEEP[0] = done.keep
    return rounds.accepted, rounds.rejections


def run(split: str, rules: list[str], output: str, natural: int = 0, genres: int = 0, budgets=BUDGETS) -> None:
    """Replay every rule at every budget on the split's copy tasks, ``natural`` continuations of the language reference
    (``eval-drafts``' natural prompts) and ``genres`` raw slices of each haystack (``step_selection_ab.tasks``)."""
    model, tokenizer = load_model(None)
    eos, rows, start = eos_token_ids(model.generation_config), [], time.time()
    result = {"split": split, "machine": machine_info(), "rows": rows, "command": _command()}
    for name, kind, depth, ids in prompt_tasks(tokenizer, split, natural, genres, NEW):
        cache, first, tail = prefill(model, ids)
        ref = decode_reference(model, cache, first, NEW, 0.0, 1.0, None, eos)
        for budget in budgets:
            for rule_name in rules:
                accepted, rejections = replay(model, cache, ref, tail, rule(rule_name), budget)
                rows.append(dict(name=name, kind=kind, depth=depth, budget=budget, rule=rule_name, acc=accepted,
                                 rej=rejections))  # fmt: skip
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
        json.dump(result, open(output, "w"), indent=1)


def report(paths: list[str]) -> str:
    """Markdown: per-token acceptance per rule, budget and depth, pooled over the runs' tasks."""
    runs = [json.load(open(p)) for p in paths]
    totals = collections.defaultdict(lambda: [0, 0])
    for rec in runs:
        for r in rec["rows"]:
            if r["kind"] == "natural":
                continue
            for depth in (r["depth"], "all"):
                totals[(r["budget"], r["rule"], depth)][0] += r["acc"]
                totals[(r["budget"], r["rule"], depth)][1] += r["rej"]
    rules = list(dict.fromkeys(r["rule"] for rec in runs for r in rec["rows"]))
    depths = sorted({r["depth"] for rec in runs for r in rec["rows"] if r["kind"] != "natural"})
    budgets = sorted({r["budget"] for rec in runs for r in rec["rows"]})
    m = runs[0]["machine"]
    commands = [c for rec in runs for c in rec.get("commands", [rec.get("command", "")]) if c]
    lines = [
        f"# Chunk scoring on the copy tasks ({runs[0]['split']} split): per-token level-1 acceptance at T=0",
        "",
        f"Device: {m['cpu']} ({m['torch_threads']} threads). torch {m['torch']}, transformers {m['transformers']}, "
        f"hf_triforce {m['hf_triforce']}; {m['date']}.",
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in commands),
        "",
        "Each task (4 passage kinds x 5 depths, 6K-token prompts) is prefilled once and level 1 replayed along the "
        "full model's own answer (64 tokens, rounds of gamma2 = 6, re-selection every 4 cached tokens) with each "
        "rule; per-token acceptance = accepted / (accepted + rejections), pooled over the kinds of a depth. "
        "Rules: see the docstring of benchmarks/experiments/copy_selection_ceiling.py (`base-sum-w1` is the package's "
        "selection with rescore_candidates=0, `two-stage-x4-peak` with rescore_candidates=4).",
        "",
    ]
    for budget in budgets if depths else ():
        lines += [f"Budget {budget} (1/{CTX // budget} of the context):", ""]
        lines += ["| rule | " + " | ".join(f"{d:g}" for d in depths) + " | all | worst depth |"]
        lines += ["|---|" + "---:|" * (len(depths) + 2)]
        for rule in [rule for rule in rules if (budget, rule, "all") in totals]:  # rules run on the copy tasks
            values = [_rate(totals[(budget, rule, d)]) for d in [*depths, "all"]]
            cells = " | ".join(f"{v:.3f}" for v in values)
            lines.append(f"| {rule} | {cells} | {min(values[:-1]):.3f} |")
        lines.append("")
    return "\n".join(lines + _natural([r for rec in runs for r in rec["rows"] if r["kind"] == "natural"], rules))


def _natural(rows: list[dict], rules: list[str]) -> list[str]:
    """Natural prompts: per budget, each rule's per-token acceptance pooled over the prompts, then per prompt (its
    rejections)."""
    lines = []
    for budget in sorted({r["budget"] for r in rows}):
        at = [r for r in rows if r["budget"] == budget]
        names = list(dict.fromkeys(r["name"] for r in at))
        used = [rule for rule in rules if any(r["rule"] == rule for r in at)]
        cell = {(r["name"], r["rule"]): r for r in at}
        lines += [f"Natural text, budget {budget} (1/{CTX // budget}), {len(names)} prompts: per-token acceptance "
                  "pooled, then per prompt (rejections).", "", "| rule | pooled | " + " | ".join(names) + " |",
                  "|---|---:|" + "---:|" * len(names)]  # fmt: skip
        for rule in used:
            pooled = _rate([sum(cell[(n, rule)][k] for n in names if (n, rule) in cell) for k in ("acc", "rej")])
            each = " | ".join(str(cell[(n, rule)]["rej"]) if (n, rule) in cell else "" for n in names)
            lines.append(f"| {rule} | {pooled:.3f} | {each} |")
        lines += ["", *_against_streaming(cell, names, used)]
    return lines


def _against_streaming(cell: dict, names: list[str], rules: list[str]) -> list[str]:
    """Per rule, StreamingLLM's rejections minus the rule's over the prompts both ran, with the percentile bootstrap
    interval of that sum over the prompts (``margin_interval``, as ``eval-drafts`` prints it); empty without a
    ``streaming`` row."""
    lines = []
    for rule in [r for r in rules if r != "streaming"]:
        both = [n for n in names if (n, rule) in cell and (n, "streaming") in cell]
        margins = [float(cell[(n, "streaming")]["rej"] - cell[(n, rule)]["rej"]) for n in both]
        if len(margins) >= 3:
            low, high = margin_interval(margins)
            lines.append(
                f"- {rule}: {sum(margins):+.0f} rejections against StreamingLLM's over {len(both)} prompts (+: fewer); "
                f"the prompts resampled, 95 % of the sums lie from {low:+.0f} to {high:+.0f}."
            )
    return lines + [""] if lines else []


def _command() -> str:
    return "benchmarks/experiments/copy_selection_ceiling.py " + shlex.join(sys.argv[1:])


def _rate(pair):
    return pair[0] / max(1, pair[0] + pair[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="tune")
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--output", default="copy-selection-ceiling.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--natural", type=int, default=0, help="natural continuations of the reference to add")
    parser.add_argument("--genres", type=int, default=0, help="raw slices of each haystack to add (natural text)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="view budgets in tokens")
    parser.add_argument("--report", nargs="*", help="print the markdown table of these recorded runs")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    budgets = tuple(int(b) for b in args.budgets.split(","))
    run(args.split, args.rules.split(","), args.output, args.natural, args.genres, budgets)


if __name__ == "__main__":
    main()
