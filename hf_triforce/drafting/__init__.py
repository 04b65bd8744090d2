"""Level-0 drafters and the hierarchical candidate generator."""

from .hierarchy import TriForceCandidateGenerator
from .model import ModelDrafter
from .ngram import NGramDrafter

__all__ = ["ModelDrafter", "NGramDrafter", "TriForceCandidateGenerator"]
