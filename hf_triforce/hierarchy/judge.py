"""Verdicts on drafts, at any level and for every row of a call: processed scores per position (each with its
row's own context), then token matching (greedy) or exact speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from ..hf.fast_processors import faster, length_only, suppress_eos
from ..hf.processors import context_free_tail
from ..sampling import verify_greedy, verify_sampled


@dataclass
class Drafts:
    """One row's drafts to judge: its tokens so far ``prefix`` ``[n]``, the drafts ``tokens`` ``[k]``, their draft
    distributions ``probs`` ``[k, V]`` (``None``: a deterministic drafter) and the verifier's float32 ``logits``
    ``[>= k + 1, V]`` (the forward's positions for ``[last token, drafts]``)."""

    prefix: torch.Tensor
    tokens: torch.Tensor
    probs: torch.Tensor | None
    logits: torch.Tensor


def processed_scores(processors: list[LogitsProcessorList], rows: list[Drafts]) -> list[torch.Tensor]:
    """Each row's processed scores ``[k + 1, V]``: ``processors[b]`` (every list has the same context-free tail)
    applied to position ``i`` of row ``b`` with that row's first ``n + i`` tokens; the context-free tail runs once
    over every position (by its exact :func:`~hf_triforce.hf.fast_processors.faster` stand-ins)."""
    tail = context_free_tail(processors[0]) if processors else 0
    heads = [LogitsProcessorList(lp[: len(lp) - tail]) for lp in processors]
    shared = heads[0] if heads else LogitsProcessorList()
    if len({tuple(map(id, head)) for head in heads}) <= 1 and length_only(shared):
        flat = _by_length(shared, rows)
    else:
        flat = _by_context(heads, rows)
    if tail:
        placeholder = torch.zeros(flat.shape[0], 1, dtype=torch.long, device=flat.device)  # never read
        flat = LogitsProcessorList(faster(p) for p in processors[0][-tail:])(placeholder, flat)
    return list(flat.split([row.tokens.shape[0] + 1 for row in rows]))


def _by_length(head, rows: list[Drafts]) -> torch.Tensor:
    """``[sum(k + 1), V]`` scores of every position through ``head``, processors that read only the length."""
    flat = torch.cat([row.logits[: row.tokens.shape[0] + 1] for row in rows])
    if not head:
        return flat
    lengths = torch.cat([torch.arange(row.tokens.shape[0] + 1) + row.prefix.shape[0] for row in rows])
    return suppress_eos(head, lengths, flat)


def _by_context(heads: list[LogitsProcessorList], rows: list[Drafts]) -> torch.Tensor:
    """``[sum(k + 1), V]`` scores of every position through its row's ``head``, grouped by context length."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for b, (head, row) in enumerate(zip(heads, rows, strict=True)):
        for i in range(row.tokens.shape[0] + 1):
            groups.setdefault((tuple(map(id, head)), row.prefix.shape[0] + i), []).append((b, i))
    scores = [[None] * (row.tokens.shape[0] + 1) for row in rows]
    for (_, length), members in groups.items():  # the group's [m, V] scores, contexts of `length` tokens
        head, logits = heads[members[0][0]], torch.stack([rows[b].logits[i] for b, i in members])
        if head:
            contexts = torch.stack([torch.cat([rows[b].prefix, rows[b].tokens])[:length] for b, _ in members])
            logits = head(contexts, logits)
        for (b, i), s in zip(members, logits, strict=True):
            scores[b][i] = s
    return torch.stack([s for row in scores for s in row])


def node_scores(processors: LogitsProcessorList, contexts: list[torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    """Processed scores ``[q, V]`` of one sequence's token-tree nodes: ``logits[i]`` through ``processors`` with the
    node's own context ``contexts[i]`` (the row's tokens, then the path to the node).

    Example:
        >>> node_scores(LogitsProcessorList(), [torch.tensor([3]), torch.tensor([3, 1])], torch.zeros(2, 4)).shape
        torch.Size([2, 4])
    """
    rows = [Drafts(context, context[:0], None, logits[i : i + 1]) for i, context in enumerate(contexts)]
    return torch.cat(processed_scores([processors] * len(rows), rows))


def judge_rows(
    processors: list[LogitsProcessorList], do_sample: bool, rows: list[Drafts]
) -> list[tuple[int, int, torch.Tensor]]:
    """Verify every row's drafts (row ``b`` with ``processors[b]``): one ``(drafts accepted, the verifier's next
    token, processed scores [k + 1, V])`` per row."""
    verdicts = []
    for row, scores in zip(rows, processed_scores(processors, rows), strict=True):
        if do_sample:
            accepted, token = verify_sampled(row.tokens, row.probs, scores.softmax(dim=-1))
        else:
            accepted, token = verify_greedy(row.tokens, scores)
        verdicts.append((accepted, token, scores))
    return verdicts
