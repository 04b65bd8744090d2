"""What would level 1 accept if every step chose its keys with its own query? (issue 18; teacher-forced oracle)

For every task of a copy-task split (``hf_triforce.evaluation.drafts.copy_tasks``: 4 passage kinds x 5 depths, 6K-token
prompts), the full model decodes its greedy answer (64 tokens); then one forward along that answer runs with an
attention function in which each query, in every layer and KV head, attends only to the keys a rule keeps. The
figure is argmax agreement with the full model's answer per position (teacher-forced: every position sees the
right prefix, as level 1 does along accepted tokens), pooled over the kinds of a depth. It bounds what a selection
rule can reach when it is applied at every step, without building it.

Rules (``B`` = the budget; chunk rules keep the sink chunk, the prompt's last 64 tokens and ``B / 8 - 9`` more
chunks of 8; the answer's own tokens are always visible):

* ``tokens-now``: the ``B`` keys with the most attention (softmax summed over the GQA group) for the current query;
* ``peak-now`` / ``mean-now``: chunks by their largest attention logit, or by query . mean key (TriForce's summary),
  for the current query;
* ``peak-prev``: ``peak-now`` with the previous position's query and one chunk of look-ahead (what a step can use);
* ``peak-stale7``: the same, chosen once per 7 positions (about a selection's age at a round's end);
* ``x4-prev``: mean keys nominate 4 x the chunks, the largest logit ranks them (``rescore_candidates=4``), with the
  previous position's query and one chunk of look-ahead; ``x4-now``: the same with the current query (what
  ``step_selection=True, rescore_candidates=4`` does inside level 1's forward);
* ``quest-now``: chunks by Quest's upper bound of their largest logit (from each chunk's channel-wise key minima
  and maxima, a quarter of the keys' size); ``quest2-now`` / ``quest4-now``: that bound nominates 2 / 4 x the
  chunks and the largest logit ranks them;
* cheaper stand-ins for ``peak-now`` that read less than every key: ``sparq16-now`` (the largest logit over the 16
  of 64 channels where the group's queries are largest, as SparQ attention approximates scores) and
  ``lowrank16-now`` (keys projected on their 16 principal directions in the prompt, per layer and KV head, as Loki
  does); ``sparq8-now`` the same over 8 channels; ``sparqRxF-now`` (``sparq8x2-now``, ``sparq16x2-now``): the
  ``R``-channel logits nominate ``F`` x the chunks and the largest logit ranks them;
* ``peak-sticky-now``: ``peak-now`` with holding, as level 1's :class:`~hf_triforce.caches.chunk_swap.ChunkSwapper`
  does (``hold=0.25``): position by position, a chunk held at the previous position stays while it ranks within the
  top ``1.25 x`` the view's chunks and the best others fill the rest (the log prints how many chunks enter per KV
  head and position);
* chunks nominated once per 7 positions (a refresh) and ranked by ``peak-now`` at each position (what level 1 does,
  ``hf_triforce.caches.chunk_swap.nominate``): ``round7xF-now`` nominates ``F x`` the view's middle chunks by the
  largest of the previous 7 positions' peaks, ``stale7x4-now`` by the peak of the position before the 7 alone
  (level 1 nominates with the newest cached token's query), both spread 2 chunks forward;
* ``peak-now`` in some layers only, ``peak-stale7`` in the others: ``layers0-14-now``, ``layers15-29-now``,
  ``layersodd-now`` (which layers need the current query).

``--rules`` runs a subset (``full`` is always run).

Run: ``.venv/bin/python benchmarks/experiments/step_selection_oracle.py --split tune --output X.json``
(about 15 minutes on 2 CPU threads); ``--report X.json [Y.json ...]`` prints the markdown of one or more runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from hf_triforce.evaluation.common.loading import load_model
from hf_triforce.evaluation.common.machine import device_line, machine_info
from hf_triforce.evaluation.drafts.copy_tasks import build_copy_prompt, copy_task_specs
from hf_triforce.hf.model import eos_token_ids
from hf_triforce.hf.versions import cache_kwargs

CTX, NEW, CHUNK, RECENT_CHUNKS, BUDGETS = 6144, 64, 8, 8, (384, 768)
RULES = (
    "full", "tokens-now", "peak-now", "mean-now", "peak-prev", "peak-stale7", "x4-prev", "x4-now", "sparq16-now",
    "lowrank16-now", "quest-now", "quest2-now", "quest4-now", "sparq8-now", "sparq8x2-now", "sparq16x2-now",
    "peak-sticky-now", "round7x2-now", "round7x4-now", "stale7x4-now", "layers0-14-now", "layers15-29-now",
    "layersodd-now",
)  # fmt: skip
NAME = "hf_triforce_oracle"
STATE: dict = {}  # the rule, budget and prompt length of the forward in progress


def chunk_scores(rule: str, q: torch.Tensor, keys: torch.Tensor, chunks: int) -> torch.Tensor:
    """``[B, H_kv, m, C]`` chunk scores of the prompt's ``chunks`` chunks for each of the ``m`` queries."""
    b, hkv, g, m, d = q.shape
    q, keys = approximated(rule, q, keys)
    by_chunk = keys[:, :, : chunks * CHUNK].reshape(b, hkv, chunks, CHUNK, d)
    if rule.startswith("mean"):
        return torch.einsum("bhgmd,bhcd->bhmc", q, by_chunk.mean(3))
    if rule == "quest-now":
        return quest_bounds(q, by_chunk)
    peak = torch.einsum("bhgmd,bhcxd->bhgmcx", q, by_chunk).amax(-1).amax(2)
    if rule.startswith(("round7", "stale7x")):
        return nominated_by_rounds(rule, peak, chunks)
    if not rule.startswith(("x4", "quest")) and "x" not in rule.removesuffix("-now"):
        return peak
    if rule.startswith("x4"):
        first, factor = torch.einsum("bhgmd,bhcd->bhmc", q, by_chunk.mean(3)), 4
    elif rule.startswith("quest"):
        first, factor = quest_bounds(q, by_chunk), int(rule[len("quest")])
    else:  # sparqRxF: the R-channel logits nominate F x the chunks
        full_q = STATE["q"]
        first = torch.einsum("bhgmd,bhcxd->bhgmcx", q, by_chunk).amax(-1).amax(2)
        peak = torch.einsum("bhgmd,bhcxd->bhgmcx", full_q, by_chunk).amax(-1).amax(2)
        factor = int(rule.removesuffix("-now").split("x")[1])
    first[..., 0], first[..., chunks - RECENT_CHUNKS :] = float("-inf"), float("-inf")  # forced below anyway
    nominated = first.topk(factor * middle_chunks(), dim=-1).indices
    return torch.full_like(first, float("-inf")).scatter(-1, nominated, peak.gather(-1, nominated))


def nominated_by_rounds(rule: str, peak: torch.Tensor, chunks: int) -> torch.Tensor:
    """``peak`` ``[B, H_kv, m, C]`` kept for the ``F x`` chunks nominated once per 7 positions and ``-inf`` elsewhere.
    ``round7xF``: the largest of the previous 7 positions' peaks (a verification's queries; the first 7 positions
    use the first), spread 2 chunks forward; ``stale7xF``: the peak of the position before the 7 only."""
    m, every = peak.shape[2], 7
    factor = int(rule.removesuffix("-now").split("x")[1])
    blocks = []
    for start in range(0, m, every):
        if rule.startswith("round7"):
            window = peak[:, :, max(0, start - every) : max(1, start)].amax(2)
        else:
            window = peak[:, :, max(0, start - 1)]
        blocks.append(spread(window, 2)[:, :, None].expand(-1, -1, min(every, m - start), -1))
    first = torch.cat(blocks, 2).clone()
    first[..., 0], first[..., chunks - RECENT_CHUNKS :] = float("-inf"), float("-inf")
    nominated = first.topk(factor * middle_chunks(), dim=-1).indices
    return torch.full_like(first, float("-inf")).scatter(-1, nominated, peak.gather(-1, nominated))


def spread(scores: torch.Tensor, chunks: int) -> torch.Tensor:
    """Each chunk's score also lifts the ``chunks`` chunks after it."""
    out = scores
    for shift in range(1, chunks + 1):
        out = torch.maximum(out, torch.nn.functional.pad(scores[..., :-shift], (shift, 0), value=float("-inf")))
    return out


def quest_bounds(q: torch.Tensor, by_chunk: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, m, C]``: Quest's upper bound of each chunk's largest logit, from its channel-wise key minima and
    maxima (``sum_d max(q_d min_d, q_d max_d)``), the largest over the GQA group."""
    upper = torch.einsum("bhgmd,bhcd->bhgmc", q.clamp(min=0), by_chunk.amax(3))
    return (upper + torch.einsum("bhgmd,bhcd->bhgmc", q.clamp(max=0), by_chunk.amin(3))).amax(2)


def approximated(rule: str, q: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[B, H_kv, G, m, D]`` and ``keys`` as a ``sparq``/``lowrank`` rule sees them (others: unchanged)."""
    if rule.startswith("sparq"):  # the other channels zeroed: the logits read only the kept ones
        STATE["q"] = q
        score = q.abs().sum(2, keepdim=True)
        channels = int(rule[len("sparq") :].removesuffix("-now").split("x")[0])
        kept = torch.zeros_like(score).scatter(-1, score.topk(channels, dim=-1).indices, 1.0)
        return q * kept, keys
    if rule.startswith("lowrank"):
        prompt = keys[:, :, : STATE["prompt"]]
        basis = torch.linalg.eigh(torch.einsum("bhld,bhle->bhde", prompt, prompt))[1][..., -16:]
        return q, keys @ basis @ basis.transpose(-1, -2)
    return q, keys


def middle_chunks() -> int:
    return STATE["budget"] // CHUNK - 1 - RECENT_CHUNKS


def aged(scores: torch.Tensor, rule: str) -> torch.Tensor:
    """Scores made with an older query (``-prev``: the position before; ``-stale7``: the first of each 7, minus one),
    then spread to the next chunk (look-ahead 1)."""
    m = scores.shape[2]
    every = 7 if rule.endswith("stale7") else 1
    source = ((torch.arange(m) // every) * every - 1).clamp(min=0)
    scores = scores[:, :, source]
    return torch.maximum(scores, torch.nn.functional.pad(scores[..., :-1], (1, 0), value=float("-inf")))


def ranks_now(rule: str, layer: int) -> bool:
    """Whether a ``layersA-B-now`` / ``layersodd-now`` rule ranks with the current query in ``layer`` (the other
    layers rank as ``peak-stale7``)."""
    if rule == "layersodd-now":
        return layer % 2 == 1
    first, last = rule.removeprefix("layers").removesuffix("-now").split("-")
    return int(first) <= layer <= int(last)


def keep_mask(rule: str, q: torch.Tensor, keys: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, m, L]``: which keys each query may attend to under ``rule``."""
    if rule == "tokens-now":
        top = probs.sum(2).topk(STATE["budget"], dim=-1).indices
        return torch.zeros(probs.sum(2).shape, dtype=torch.bool).scatter(-1, top, True)
    chunks = STATE["prompt"] // CHUNK
    scores = chunk_scores(rule, q, keys, chunks)
    if rule.endswith(("prev", "stale7")) or (rule.startswith("layers") and not ranks_now(rule, STATE["layer"])):
        scores = aged(scores, "peak-stale7" if rule.startswith("layers") else rule)
    scores = scores.clone()
    scores[..., 0], scores[..., chunks - RECENT_CHUNKS :] = float("inf"), float("inf")  # sink and recent tokens
    if "sticky" in rule:
        kept = sticky(scores, middle_chunks() + 1 + RECENT_CHUNKS, middle_chunks() // 4)
    else:
        top = scores.topk(middle_chunks() + 1 + RECENT_CHUNKS, dim=-1).indices
        kept = torch.zeros(scores.shape, dtype=torch.bool).scatter(-1, top, True)
    mask = torch.ones(*kept.shape[:3], keys.shape[2], dtype=torch.bool)
    mask[..., : chunks * CHUNK] = kept.repeat_interleave(CHUNK, dim=-1)
    return mask


def sticky(scores: torch.Tensor, k: int, extra: int) -> torch.Tensor:
    """``[B, H_kv, m, C]``: the top ``k`` chunks at the first position, then, position by position, the held chunks
    still in the top ``k + extra`` stay and the best others fill the rest (``ChunkSwapper``'s ``hold``; the sink and
    the recent chunks score ``inf`` here and stay)."""
    held, out = None, []
    for i in range(scores.shape[2]):
        order = scores[:, :, i].topk(k + extra, dim=-1).indices  # best first
        fresh = torch.arange(k + extra) < k
        if held is not None:
            was = held.gather(-1, order)
            need = k - was.sum(-1, keepdim=True)
            fresh = was | (~was & ((~was).cumsum(-1) <= need))
            STATE["arrivals"] = STATE.get("arrivals", 0) + int((fresh & ~was).sum())
            STATE["steps"] = STATE.get("steps", 0) + was.shape[0] * was.shape[1]
        held = torch.zeros(scores[:, :, i].shape, dtype=torch.bool).scatter(-1, order, fresh.expand_as(order))
        out.append(held)
    return torch.stack(out, 2)


def oracle_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Attention of ``query`` ``[B, H_q, m, D]`` (the last ``m`` positions) over the keys ``STATE['rule']`` keeps."""
    b, hq, m, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    q = query.reshape(b, hkv, hq // hkv, m, d).float()
    STATE["layer"] = module.layer_idx
    logits = torch.einsum("bhgmd,bhld->bhgml", q, key.float()) * scaling
    causal = torch.arange(length)[None] <= (length - m + torch.arange(m))[:, None]
    logits = logits.masked_fill(~causal, float("-inf"))
    if STATE["rule"] != "full":
        keep = keep_mask(STATE["rule"], q, key.float(), logits.softmax(-1))
        logits = logits.masked_fill(~keep[:, :, None], float("-inf"))
    out = torch.einsum("bhgml,bhld->bhgmd", logits.softmax(-1), value.float()).to(query.dtype)
    return out.reshape(b, hq, m, d).transpose(1, 2).contiguous(), None


def greedy_answer(model, ids: torch.Tensor, cache: DynamicCache, eos: list[int]) -> torch.Tensor:
    """The full model's greedy answer ``[m]`` to ``ids``; ``cache`` then holds the prompt and more."""
    out = model(input_ids=ids, **cache_kwargs(cache), use_cache=True, logits_to_keep=1)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < NEW and tokens[-1] not in eos:
        out = model(input_ids=torch.tensor([[tokens[-1]]]), **cache_kwargs(cache), use_cache=True)
        tokens.append(int(out.logits[0, -1].argmax()))
    return torch.tensor(tokens)


def agreement(model, cache: DynamicCache, answer: torch.Tensor, n: int, rule: str, budget: int) -> list[bool]:
    """Per position of ``answer`` after the first: does the rule's forward pick the full model's token?"""
    if cache.get_seq_length() > n:
        cache.crop(-(cache.get_seq_length() - n))
    STATE.update(rule=rule, budget=budget, prompt=n)
    previous, model.config._attn_implementation = model.config._attn_implementation, NAME
    try:
        out = model(input_ids=answer[None, :-1], **cache_kwargs(cache), use_cache=True)
    finally:
        model.config._attn_implementation = previous
    return (out.logits[0].argmax(-1) == answer[1:]).tolist()


def run(split: str, output: str, rules: tuple[str, ...] = RULES) -> None:
    AttentionInterface.register(NAME, oracle_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model, tokenizer = load_model(None)
    eos, texts, rows, start = eos_token_ids(model.generation_config), {}, [], time.time()
    result = {"split": split, "machine": machine_info(), "command": _command(), "rows": rows}
    for spec in copy_task_specs(split):
        ids = build_copy_prompt(tokenizer, spec, CTX - NEW, texts).input_ids
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            answer = greedy_answer(model, ids, cache, eos)
            for rule in ("full", *[r for r in rules if r != "full"]):
                for budget in BUDGETS if rule != "full" else BUDGETS[:1]:
                    agree = agreement(model, cache, answer, ids.shape[1], rule, budget)
                    rows.append(dict(kind=spec.kind, depth=spec.depth, rule=rule, budget=budget, agree=agree))
        arrivals = STATE.pop("arrivals", 0) / max(1, STATE.pop("steps", 0))
        print(f"{spec.name}: {time.time() - start:.0f} s; sticky arrivals per head and step {arrivals:.2f}", flush=True)
        json.dump(result, open(output, "w"), indent=1)


def report(paths: list[str]) -> str:
    """Markdown of one or more runs (the first run's split and machine): agreement per rule, budget and depth, pooled
    over the kinds; a rule in several runs counts from the first that has it (the oracle is deterministic)."""
    runs = [json.load(open(path)) for path in paths]
    seen = [{r["rule"] for r in run["rows"]} for run in runs]
    first = {rule: i for i in reversed(range(len(runs))) for rule in seen[i]}
    rows = [r for i, run in enumerate(runs) for r in run["rows"] if first[r["rule"]] == i]
    rec = {**runs[0], "rows": rows, "command": "`; `".join(run["command"] for run in runs)}
    totals = collections.defaultdict(lambda: [0, 0])
    for r in rec["rows"]:
        for depth in (r["depth"], "all"):
            totals[(r["rule"], r["budget"], depth)][0] += sum(r["agree"])
            totals[(r["rule"], r["budget"], depth)][1] += len(r["agree"])
    depths = sorted({r["depth"] for r in rec["rows"]})
    lines = [
        f"# Teacher-forced oracle of per-step selection rules ({rec['split']} split), T=0",
        "",
        device_line(rec),
        "",
        f"Command: `{rec['command']}`",
        "",
        "Argmax agreement with the full model along its own greedy answer, each query attending only to the keys the "
        "rule keeps (see the script's docstring), pooled over the 4 passage kinds of a depth.",
        "",
    ]
    for budget in BUDGETS:
        lines += [f"Budget {budget} (1/{CTX // budget} of the context):", ""]
        lines += ["| rule | " + " | ".join(f"{d:g}" for d in depths) + " | all | worst depth |"]
        lines += ["|---|" + "---:|" * (len(depths) + 2)]
        for rule in [r for r in RULES if any(row["rule"] == r for row in rec["rows"])]:
            key = budget if rule != "full" else BUDGETS[0]
            values = [totals[(rule, key, d)][0] / max(1, totals[(rule, key, d)][1]) for d in [*depths, "all"]]
            lines.append(f"| {rule} | " + " | ".join(f"{v:.3f}" for v in values) + f" | {min(values[:-1]):.3f} |")
        lines.append("")
    return "\n".join(lines)


def _command() -> str:
    return "benchmarks/experiments/step_selection_oracle.py " + " ".join(sys.argv[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="tune")
    parser.add_argument("--output", default="step-selection-oracle.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, of {', '.join(RULES)}")
    parser.add_argument("--report", nargs="+", help="JSON results to print as one markdown report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    run(args.split, args.output, tuple(args.rules.split(",")))


if __name__ == "__main__":
    main()
