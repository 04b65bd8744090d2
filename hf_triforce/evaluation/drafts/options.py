"""What ``hf-triforce eval-drafts`` measures: :class:`EvalOptions`, checked before anything is loaded.

Example:
    >>> EvalOptions(budget_fractions=parse_fractions("1/16,1/8"), headline_fraction=1 / 8).budget(1 / 16)
    256
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import TriForceConfig
from ...errors import TriForceConfigError
from ..common.haystacks import HAYSTACKS


class EvalOptionsError(TriForceConfigError):
    """Evaluation options that cannot be run; the message says what to change."""


@dataclass
class EvalOptions:
    """What ``hf-triforce eval-drafts`` measures; the CLI fills it from its arguments.

    ``natural_prompts`` natural continuations come from the document, or, when ``natural_haystacks`` names some of
    :data:`~hf_triforce.evaluation.common.haystacks.HAYSTACKS`, ``natural_prompts`` raw slices of each of those.
    """

    model: str | None = None
    document: str | None = None
    context_tokens: int = 4096
    new_tokens: int = 64
    budget_fractions: list[float] = field(default_factory=lambda: [1 / 16, 1 / 8, 1 / 4])
    headline_fraction: float = 1 / 8
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6, 1.0])
    top_p: float = 1.0
    natural_prompts: int = 3
    natural_haystacks: list[str] = field(default_factory=list)
    needle_depths: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    copy_split: str | None = None
    ablations: bool = True
    draft_layers: list[int] = field(default_factory=lambda: [4])
    streaming_sinks: int = 8
    end_to_end: bool = True
    e2e_context_tokens: int = 2048
    e2e_new_tokens: int = 64
    seed: int = 0
    max_rows: int = 32

    def __post_init__(self) -> None:
        if self.new_tokens < 2:
            raise EvalOptionsError(
                f"--new-tokens must be at least 2 (level 1 drafts from the second), got {self.new_tokens}."
            )
        if not self.budget_fractions or any(not 0 < f <= 1 for f in self.budget_fractions):
            raise EvalOptionsError(f"budget fractions must be in (0, 1], got {self.budget_fractions}.")
        if self.headline_fraction not in self.budget_fractions:
            raise EvalOptionsError(
                f"the headline budget fraction {self.headline_fraction:g} must be one of --budgets "
                f"{[round(f, 4) for f in self.budget_fractions]}."
            )
        if any(t < 0 for t in self.temperatures) or not self.temperatures:
            raise EvalOptionsError(f"temperatures must be >= 0, got {self.temperatures}.")
        if not 0 < self.top_p <= 1:
            raise EvalOptionsError(f"--top-p must be in (0, 1], got {self.top_p}.")
        if self.natural_prompts < 0 or any(not 0 <= d <= 1 for d in self.needle_depths):
            raise EvalOptionsError("--natural-prompts must be >= 0 and needle depths in [0, 1].")
        unknown = sorted(set(self.natural_haystacks) - set(HAYSTACKS))
        if unknown:
            raise EvalOptionsError(f"unknown --natural-haystacks {unknown}: choose from {sorted(HAYSTACKS)}.")
        if self.copy_split not in (None, "tune", "heldout"):
            raise EvalOptionsError(f"--copy-tasks must be 'tune' or 'heldout', got {self.copy_split!r}.")
        if self.natural_prompts == 0 and not self.needle_depths:
            raise EvalOptionsError("nothing to measure: pass --natural-prompts > 0 or some --needle-depths.")

    def budget(self, fraction: float, context: int | None = None, chunk_size: int = 8) -> int:
        """``fraction`` of the context in tokens, rounded down to whole chunks (at least the smallest valid).

        Example:
            >>> EvalOptions().budget(1 / 8)
            512
        """
        minimum = TriForceConfig(chunk_size=chunk_size, retrieval_budget=2 * chunk_size).min_retrieval_budget
        tokens = int(fraction * (context or self.context_tokens)) // chunk_size * chunk_size
        return max(minimum, tokens)


def parse_fractions(text: str) -> list[float]:
    """``"1/16,1/8,0.25"`` -> ``[0.0625, 0.125, 0.25]`` (an empty string gives ``[]``).

    Raises:
        EvalOptionsError: a value that is not a number or ``a/b``.

    Example:
        >>> parse_fractions("1/8, 0.6")
        [0.125, 0.6]
    """
    values = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            numerator, _, denominator = item.partition("/")
            values.append(float(numerator) / float(denominator) if denominator else float(numerator))
        except (ValueError, ZeroDivisionError):
            raise EvalOptionsError(f"{item!r} is not a number or a fraction such as 1/8.") from None
    return values
