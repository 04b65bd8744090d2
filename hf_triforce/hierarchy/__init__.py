"""The levels below the full cache: level-0 drafters (the :mod:`.drafter` protocol) and level-1 drafting over the
retrieval view (:mod:`.level1`), each round's schedule (:mod:`.planner`) and verdicts on drafts (:mod:`.judge`)."""

from .drafter import Drafter
from .level1 import Level1Drafter
from .model_drafter import ModelDrafter
from .ngram import NGramDrafter
from .rows import Row, RowDraft, padded_tokens

__all__ = [
    "Drafter", "Level1Drafter", "ModelDrafter", "NGramDrafter", "Row", "RowDraft", "padded_tokens",
]  # fmt: skip
