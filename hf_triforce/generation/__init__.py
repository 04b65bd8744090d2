"""One TriForce ``generate()`` call: switched on per model (:mod:`.enable`), planned once before any forward
(:mod:`.plan`), wired (:mod:`.call`), then prefilled and decoded in rounds (:mod:`.loop`)."""

from .custom import CUSTOM_GENERATE_DIR, hub_generate, triforce_generate
from .enable import disable, enable, is_enabled, last_stats
from .state import TriForceState

__all__ = [
    "CUSTOM_GENERATE_DIR", "TriForceState", "disable", "enable", "hub_generate", "is_enabled", "last_stats",
    "triforce_generate",
]  # fmt: skip
