"""One TriForce ``generate()`` call: switched on per model, planned, prefilled, then decoded in rounds.

* :mod:`.enable`: ``enable``/``disable``/``last_stats`` (the public switches) and :mod:`.state`, the one state
  object per enabled model;
* :mod:`.plan`: what the call runs, decided once from the capability table, before any forward;
* :mod:`.call`: the ``custom_generate`` entry point: the plan, and the wiring of the three levels;
* :mod:`.loop`: the prefill and the rounds (level-1 drafting, level-2 verification, stopping), one loop for one
  sequence or a batch;
* :mod:`.custom`: the same call through transformers' ``generate(custom_generate=...)`` convention, without
  ``enable``.
"""

from .custom import CUSTOM_GENERATE_DIR, hub_generate, triforce_generate
from .enable import disable, enable, is_enabled, last_stats
from .state import TriForceState

__all__ = [
    "CUSTOM_GENERATE_DIR",
    "TriForceState",
    "disable",
    "enable",
    "hub_generate",
    "is_enabled",
    "last_stats",
    "triforce_generate",
]
