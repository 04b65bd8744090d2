"""N-gram (prompt lookup) drafter: copies what followed the latest earlier occurrence of the suffix."""

from __future__ import annotations

import torch


class NGramDrafter:
    """Deterministic level-0 :class:`~hf_triforce.hierarchy.drafter.Drafter`: for ``n`` from ``ngram_max`` down to
    ``ngram_min``, proposes what followed the latest earlier occurrence of the last ``n`` tokens.

    Example:
        >>> NGramDrafter(2, 1).propose(torch.tensor([5, 6, 7, 8, 5, 6]), 2)
        (tensor([7, 8]), None)
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def propose(self, prefix: torch.Tensor, k: int) -> tuple[torch.Tensor, None]:
        """Up to ``k`` draft tokens ``[<=k]`` continuing ``prefix`` (``[n]`` token ids); no probabilities."""
        for n in range(min(self.ngram_max, prefix.shape[0] - 1), self.ngram_min - 1, -1):
            hits = (prefix[:-1].unfold(0, n, 1) == prefix[-n:]).all(dim=1).nonzero()  # earlier windows equal to the end
            if hits.numel():
                start = int(hits[-1, 0])  # the latest
                return prefix[start + n : start + n + k], None
        return prefix[:0], None

    def reset(self) -> None:
        """Nothing to forget: each proposal reads only its prefix."""
