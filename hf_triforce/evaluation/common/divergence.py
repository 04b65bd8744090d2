"""Where two greedy outputs first differ, and whether rounding noise between the two runs explains it.

Greedy TriForce must return plain ``generate()``'s tokens. In float32 it does; in bfloat16 the full-cache
verification computes ``gamma2 + 1`` positions in one forward where plain ``generate()`` computes one, so cuBLAS
and the attention kernels accumulate in other orders, and the logits of the two paths differ in their last bits.
Greedy output can then change only where the top-2 logits are closer than that noise: a near-tie.

:func:`first_divergence` measures the noise on the rows *before* the first difference, where both runs had
the same tokens and agreed, and calls the difference a near-tie when both runs' top-2 gaps there are at most
twice that noise. (The differing row's own noise cannot be the yardstick: two greedy runs' gaps always sum to
at most twice it, whatever caused the difference.) A difference at the first new token, with no agreeing row
before it, is never called a near-tie. A fault that shifts every row's logits as much as the difference
(a wrong cache, say) also raises the noise and can pass as a near-tie: the float32 comparison is the check for
that. ``tests/integration/test_cuda_graphs.py`` applies the same rule on CUDA, and the benchmark reports it in
its "identical" column.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Divergence:
    """The first position where two greedy outputs differ.

    Attributes:
        new_token: index of the differing token among the generated ones (0 = the first new token).
        plain_token, triforce_token: the two runs' token ids there.
        gaps: ``(plain's logit of its token - plain's logit of TriForce's token, TriForce's logit of its token -
            TriForce's logit of plain's token)``, each ``>= 0`` for greedy runs.
        logits_noise: the largest absolute difference between the two runs' logits over the rows before
            ``new_token`` (where they agreed); 0.0 when ``new_token`` is 0.
        row_noise: the same over the differing row alone.
    """

    new_token: int
    plain_token: int
    triforce_token: int
    gaps: tuple[float, float]
    logits_noise: float
    row_noise: float

    @property
    def near_tie(self) -> bool:
        """Both runs' top-2 gaps are at most twice the noise seen while they agreed: rounding chose."""
        return self.new_token > 0 and max(self.gaps) <= 2 * self.logits_noise

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``near_tie`` included."""
        return {**asdict(self), "gaps": list(self.gaps), "near_tie": self.near_tie}


def first_divergence(
    prompt_length: int,
    plain: torch.LongTensor,
    fast: torch.LongTensor,
    plain_logits: tuple[torch.Tensor, ...],
    fast_logits: tuple[torch.Tensor, ...],
) -> Divergence | None:
    """The first generated position where ``plain`` and ``fast`` differ, or None when they are equal.

    Args:
        prompt_length: tokens of the prompt both sequences start with.
        plain, fast: ``[1, prompt + new]`` token ids of the two greedy runs.
        plain_logits, fast_logits: ``generate(..., output_logits=True)``'s per-step logits, each ``[1, vocab]``.

    Example:
        >>> ids = torch.tensor([[5, 1, 2]]); other = torch.tensor([[5, 1, 3]])
        >>> p = (torch.tensor([[0.0, 9.0, 0, 0]]), torch.tensor([[0.0, 0, 1.0, 0.99]]))
        >>> q = (torch.tensor([[0.0, 9.02, 0, 0]]), torch.tensor([[0.0, 0, 1.0, 1.01]]))
        >>> d = first_divergence(1, ids, other, p, q)
        >>> d.new_token, d.plain_token, d.triforce_token, d.near_tie
        (1, 2, 3, True)
        >>> first_divergence(1, ids, ids, p, p) is None
        True
    """
    new_plain, new_fast = plain[0, prompt_length:], fast[0, prompt_length:]
    n = min(new_plain.numel(), new_fast.numel())
    differ = (new_plain[:n] != new_fast[:n]).nonzero()
    if not differ.numel():
        return None
    step = int(differ[0, 0])
    noise = [float((plain_logits[i].float() - fast_logits[i].float()).abs().max()) for i in range(step + 1)]
    p, q = plain_logits[step][0].float(), fast_logits[step][0].float()
    a, b = int(new_plain[step]), int(new_fast[step])
    gaps = float(p[a] - p[b]), float(q[b] - q[a])
    return Divergence(step, a, b, gaps, max(noise[:step], default=0.0), noise[step])


def identical_cell(row: dict[str, Any]) -> str:
    """A benchmark row's "identical" cell: "yes", "n/a (sampling)", "near-tie at N" (greedy outputs differ first
    at new token N, where the logits noise between the two runs explains it: bf16) or "NO at N" (a real
    divergence).

    Example:
        >>> identical_cell({"identical_output": False, "temperature": 0.0,
        ...                 "divergence": {"near_tie": True, "new_token": 41}})
        'near-tie at 41'
    """
    if row["identical_output"]:
        return "yes"
    if row["temperature"] > 0:
        return "n/a (sampling)"
    found = row.get("divergence")
    if found is None:  # recorded before the divergence was
        return "NO"
    if found["near_tie"] is None:  # recorded under an earlier rule that could not tell
        return f"differs at {found['new_token']} (unclassified)"
    return f"{'near-tie' if found['near_tie'] else 'NO'} at {found['new_token']}"
