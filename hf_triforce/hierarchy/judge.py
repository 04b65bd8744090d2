"""One sequence's verdict on its drafts, at any level: processed scores per position, then the exact rule.

Level 1 judging level-0 drafts and level 2 judging level-1 (or level-0) drafts do the same thing, for one sequence
or one row of a batch: the logits of ``[last token, drafts]`` go through the call's logits processors with that
sequence's own context, position by position, then token matching (greedy) or exact speculative sampling.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..sampling import verify_greedy, verify_sampled


def judge_row(
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    prefix: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
) -> tuple[int, int, torch.Tensor]:
    """Verify one row's ``[k]`` drafts after its ``[n]`` tokens ``prefix`` against its float32 ``logits``
    ``[>= k + 1, V]`` (the forward's positions for ``[last token, drafts]``), at either level.

    Each position's scores go through the call's processors with that row's own context; then token matching, or
    exact speculative sampling against ``draft_probs`` ``[k, V]`` (``None``: a deterministic drafter).

    Returns:
        ``(drafts accepted, the verifier's next token, processed scores [k + 1, V])``.

    Example:
        >>> judge_row(LogitsProcessorList(), False, torch.tensor([3]), torch.tensor([1]), None,
        ...           torch.tensor([[0.0, 1.0], [1.0, 0.0]]))[:2]
        (1, 0)
    """
    context = torch.cat([prefix, drafts])
    n, k = prefix.shape[0], drafts.shape[0]
    rows = [logits_processor(context[None, : n + i], logits[i : i + 1].clone())[0] for i in range(k + 1)]
    scores = torch.stack(rows)
    if do_sample:
        accepted, token = verify_sampled(drafts, draft_probs, scores.softmax(dim=-1))
    else:
        accepted, token = verify_greedy(drafts, scores)
    return accepted, token, scores
