"""The rows of a call as the levels see them: a row's tokens and processors, and the drafts it hands level 2."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList

from ..stats import TriForceStats


@dataclass
class Row:
    """One row of a call: its tokens so far (``ids`` ``[n]``, padding included, as ``generate()`` lays them out), its
    prompt's real tokens (``None``: no padding), its logits processors (with this row's batch index) and stats."""

    index: int
    ids: torch.Tensor
    real_prompt: torch.Tensor | None = None
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    stats: TriForceStats = field(default_factory=TriForceStats)
    done: bool = False
    prompt_length: int = 0

    def real_ids(self) -> torch.Tensor:
        """``[m]`` the row's tokens without its padding: what its level-0 drafter reads.

        Example:
            >>> Row(0, torch.tensor([0, 0, 5, 6, 7]), torch.tensor([5, 6]), prompt_length=4).real_ids().tolist()
            [5, 6, 7]
        """
        if self.real_prompt is None:
            return self.ids
        return torch.cat([self.real_prompt, self.ids[self.prompt_length :]])


@dataclass
class RowDraft:
    """One row's drafts for the full cache: tokens ``[g]`` and the scores ``[g, V]`` they came from (``None``:
    a deterministic level-0 drafter, a one-hot ``q``)."""

    tokens: torch.Tensor
    scores: torch.Tensor | None = None
    steps: list[torch.Tensor] = field(default_factory=list)


def padded_tokens(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """``tokens`` ``[n]`` padded to ``[width]`` with its last token (padding slots are never judged nor kept).

    Example:
        >>> padded_tokens(torch.tensor([4, 5]), 4).tolist()
        [4, 5, 5, 5]
    """
    return torch.cat([tokens, tokens[-1:].expand(width - tokens.shape[0])])
