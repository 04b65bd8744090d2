"""The level-0 ``Drafter`` protocol: what the level-1 drafting loop needs of a drafter."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Drafter(Protocol):
    """A level-0 drafter: proposes tokens that level 1 verifies with exact speculative sampling.

    A drafter that samples returns the distributions it drew from (``q``, after the call's logits processors);
    a deterministic one (n-gram lookup, a greedy model) returns ``None``, which the verification treats as a
    one-hot ``q`` at each drafted token. Either way the verified output is exactly level 1's distribution.

    Implemented by :class:`~hf_triforce.hierarchy.suffix.SuffixDrafter`,
    :class:`~hf_triforce.hierarchy.ngram.NGramDrafter` and :class:`~hf_triforce.hierarchy.model_drafter.ModelDrafter`.

    Example:
        >>> from hf_triforce.hierarchy import NGramDrafter
        >>> isinstance(NGramDrafter(), Drafter)
        True
    """

    def commit(self, sequence: torch.Tensor) -> None:
        """The ``[n]`` tokens level 2 has committed so far (called once per round, before any proposal).

        Committed tokens never change; tokens after them (this round's level-1 tokens) may be rolled back.
        """
        ...

    def propose(self, prefix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``k`` tokens continuing ``prefix``.

        Args:
            prefix: ``[n]`` token ids (the accepted sequence so far, plus level 1's tokens of this round).
            k: the most tokens to propose (``>= 1``).

        Returns:
            ``([m] token ids, m <= k; [m, V] draft probabilities or None)``.
        """
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
