"""The level-0 ``Drafter`` protocol: what the level-1 drafting loop needs of a drafter."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Drafter(Protocol):
    """A level-0 drafter (``NGramDrafter``, ``ModelDrafter``): proposes tokens level 1 verifies
    exactly. A sampling drafter returns the distributions it drew from (``q``, after the call's logits processors), a
    deterministic one ``None`` (a one-hot ``q``).

    Example:
        >>> from hf_triforce.hierarchy import NGramDrafter
        >>> isinstance(NGramDrafter(), Drafter)
        True
    """

    def propose(self, prefix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``k >= 1`` tokens continuing ``prefix`` ``[n]`` (the tokens level 2 committed, then this round's
        level-1 tokens): ``([m] token ids, m <= k; [m, V] draft probabilities or None)``."""
        ...

    def reset(self) -> None:
        """Forget what the proposals consumed: the next one starts over (after the planner's timed proposals)."""
        ...


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens the ``[n]`` and ``[m]`` token sequences ``a`` and ``b`` share.

    Example:
        >>> common_prefix_length(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 5]))
        2
    """
    n = min(a.shape[0], b.shape[0])
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0, 0]) if mismatch.numel() else n
