"""The levels below the full cache: level-0 drafters and level-1 drafting over the retrieval view.

* :mod:`.drafter`: the level-0 ``Drafter`` protocol (:mod:`.suffix`, :mod:`.ngram`, :mod:`.model_drafter`);
* :mod:`.level1`: :class:`Level1Drafter`, the target over a retrieval view, verifying level 0, for every row of a call;
* :mod:`.planner`: each round's schedule; :mod:`.judge`: verdicts on drafts; :mod:`.static_steps`: CUDA graphs.
"""

from .drafter import Drafter
from .level1 import Level1Drafter
from .model_drafter import ModelDrafter
from .ngram import NGramDrafter
from .rows import Row, RowDraft, padded_tokens
from .suffix import SuffixDrafter

__all__ = [
    "Drafter",
    "Level1Drafter",
    "ModelDrafter",
    "NGramDrafter",
    "Row",
    "RowDraft",
    "SuffixDrafter",
    "padded_tokens",
]
