"""Benchmarks (not tests): plain ``generate()`` against TriForce, measured in one process."""

from .compare import Comparison, RunResult, compare, measure
from .timing import TimingStreamer

__all__ = ["Comparison", "RunResult", "TimingStreamer", "compare", "measure"]
