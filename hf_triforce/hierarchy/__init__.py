"""The levels below the full cache: level-0 drafters and level-1 drafting over the retrieval view.

* :mod:`.drafter`: the level-0 ``Drafter`` protocol; :mod:`.suffix`, :mod:`.ngram` and :mod:`.model_drafter`
  implement it;
* :mod:`.level1`: :class:`Level1Drafter`, the target's weights over a retrieval view, verifying level 0, for every
  row of a call (one sequence is a batch of one); :mod:`.level1_steps`: how its forwards run (transformers' forward,
  the direct forward, fixed shapes and CUDA graphs), one strategy per call;
* :mod:`.judge`: one sequence's verdict on its drafts (processed scores, then the exact rule), at any level;
* :mod:`.static_steps`: fixed-shape decoding steps (CUDA graphs) for levels 0 and 1.
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
