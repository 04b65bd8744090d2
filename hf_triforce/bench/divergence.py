"""Where two greedy outputs first differ, and whether rounding noise between the two runs explains it.

Greedy TriForce must return plain ``generate()``'s tokens. In float32 it does; in bfloat16 the full-cache
verification computes ``gamma2 + 1`` positions in one forward where plain ``generate()`` computes one, so cuBLAS
and the attention kernels accumulate in other orders, and the logits of the two paths differ in their last bits.
Greedy output can then change only where the top-2 logits are closer than that noise: a near-tie.

:func:`first_divergence` measures the noise on the rows *before* the first difference, where both runs had
the same tokens and agreed, and calls the difference a near-tie when both runs' top-2 gaps there are at most
twice that noise. (The differing row's own noise cannot be the yardstick: two greedy runs' gaps always sum to
at most twice it, whatever caused the difference.) A difference at the first new token, with no agreeing row
before it, is never called a near-tie.

A fault that shifts every row's logits as much as the difference (a wrong cache, say) also raises the noise, so
the noise alone would pass it. A near-tie therefore also needs both gaps to be at most :data:`NEAR_TIE_ULPS`
units in the last place of the dtype the model ran in, at the magnitude of the tied logits: rounding moves a
logit by a few of its dtype's steps, a fault by as much as it likes (:func:`logit_ulp` defines the unit,
:data:`NEAR_TIE_ULPS` the count). The dtype is passed in, because ``generate()``
returns float32 logits whatever the model computed in. In float32 the cap is 2**16 times tighter than in
bfloat16, so a float32 difference is, in practice, never a near-tie: the float32 comparison stays the check. The
GPU tests apply the same rule on CUDA, and the benchmark reports it in its "identical" column.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..errors import InvalidInputError

NEAR_TIE_ULPS = 16
"""How many units in the last place (:func:`logit_ulp`) of the model's dtype a near-tie's top-2 gaps may span: over
twice the largest gap and above the largest noise a correct bfloat16 run has shown (tiny CPU models; Llama-3.1-8B
shapes on H100/H200: gaps of at most 7 units, noise of 8-10.6). In float32 the same 16 units are below the noise
of correct runs, so a float32 difference is in effect always a divergence."""


def logit_ulp(value: float, dtype: torch.dtype) -> float:
    """The unit in the last place of ``dtype`` at ``max(1, |value|)``: the distance from ``2**e`` (the power of two
    at or below it) to the next number ``dtype`` can hold, ``finfo(dtype).eps * 2**e``.

    Two logits of one binade, as a near-tie's top two are, differ by a whole number of these. Below 1 the unit
    stops shrinking: a logit near 0 is a dot product whose terms cancelled, and it carries their rounding error,
    not its own.

    Example:
        >>> logit_ulp(2.78, torch.bfloat16), logit_ulp(5.0, torch.bfloat16), logit_ulp(0.01, torch.bfloat16)
        (0.015625, 0.03125, 0.0078125)
        >>> logit_ulp(-5.0, torch.float32) == 4 * torch.finfo(torch.float32).eps
        True
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidInputError(f"dtype must be a floating-point torch.dtype (the model's), got {dtype!r}")
    _, exponent = math.frexp(max(1.0, abs(value)))  # max(1, |value|) = m * 2**exponent, 0.5 <= m < 1
    return math.ldexp(torch.finfo(dtype).eps, exponent - 1)


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
        dtype: the name of the dtype the model computed the logits in (``"bfloat16"``).
        gap_cap: the most a near-tie's gaps may be whatever the noise: :data:`NEAR_TIE_ULPS` units in the last
            place of ``dtype`` (:func:`logit_ulp`) at the largest magnitude of the two tokens' logits in either run.
    """

    new_token: int
    plain_token: int
    triforce_token: int
    gaps: tuple[float, float]
    logits_noise: float
    row_noise: float
    dtype: str
    gap_cap: float

    @property
    def near_tie(self) -> bool:
        """Both runs' top-2 gaps are at most twice the noise seen while they agreed, and at most ``gap_cap`` (a
        few steps of the model's dtype): rounding chose."""
        return self.new_token > 0 and max(self.gaps) <= min(2 * self.logits_noise, self.gap_cap)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``near_tie`` included. (Records written before ``dtype`` and ``gap_cap`` lack them;
        :func:`identical_cell` reads only ``near_tie`` and ``new_token``.)"""
        return {**asdict(self), "gaps": list(self.gaps), "near_tie": self.near_tie}


def first_divergence(
    prompt_length: int,
    plain: torch.LongTensor,
    fast: torch.LongTensor,
    plain_logits: tuple[torch.Tensor, ...],
    fast_logits: tuple[torch.Tensor, ...],
    *,
    dtype: torch.dtype,
) -> Divergence | None:
    """The first generated position where ``plain`` and ``fast`` differ, or None when they are equal.

    Args:
        prompt_length: tokens of the prompt both sequences start with.
        plain, fast: ``[1, prompt + new]`` token ids of the two greedy runs.
        plain_logits, fast_logits: ``generate(..., output_logits=True)``'s per-step logits, each ``[1, vocab]``.
        dtype: the dtype the model computed in (``model.dtype``), not the logits' (``generate()`` returns them
            in float32): it sets ``gap_cap``.

    Example:
        >>> ids = torch.tensor([[5, 1, 2]]); other = torch.tensor([[5, 1, 3]])
        >>> p = (torch.tensor([[0.0, 9.0, 0, 0]]), torch.tensor([[0.0, 0, 1.0, 0.99]]))
        >>> q = (torch.tensor([[0.0, 9.02, 0, 0]]), torch.tensor([[0.0, 0, 1.0, 1.01]]))
        >>> d = first_divergence(1, ids, other, p, q, dtype=torch.bfloat16)
        >>> d.new_token, d.plain_token, d.triforce_token, d.gap_cap, d.near_tie
        (1, 2, 3, 0.125, True)
        >>> first_divergence(1, ids, other, p, q, dtype=torch.float32).near_tie  # 0.01 is 84,000 float32 steps
        False
        >>> first_divergence(1, ids, ids, p, p, dtype=torch.bfloat16) is None
        True
    """
    logit_ulp(0.0, dtype)  # a wrong dtype fails here, not only when the outputs differ
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
    tied = max(abs(float(x)) for x in (p[a], p[b], q[a], q[b]))  # each run's top two
    cap = NEAR_TIE_ULPS * logit_ulp(tied, dtype)
    return Divergence(
        step, a, b, gaps, max(noise[:step], default=0.0), noise[step], str(dtype).removeprefix("torch."), cap
    )


def identical_cell(row: dict[str, Any]) -> str:
    """A benchmark row's "identical" cell: "yes", "n/a (sampling)", "near-tie at N" (greedy outputs differ first
    at new token N, where rounding explains it, :attr:`Divergence.near_tie`: bf16) or "NO at N" (a real
    divergence). Records from before ``gap_cap`` keep the ``near_tie`` they were written with.

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
