"""The end-to-end benchmark: plain ``generate()`` against TriForce, measured in one process.

* :mod:`.measure` times one ``generate()`` call (:class:`RunResult`); :mod:`.timing` its streamer;
* :mod:`.compare` runs plain then TriForce on the same prompt (:class:`Comparison`);
* :mod:`.run` sweeps prompt lengths, temperatures, budgets and drafters (``hf-triforce bench``);
  :mod:`.report` writes its JSON and markdown; :mod:`.profile` adds a torch.profiler breakdown per phase;
  :mod:`.real_acceptance` is the real-text acceptance of its modeled speedup;
* :mod:`.tuning` sweeps one ``TriForceConfig`` knob at a time (``make tuning``); :mod:`.contention` tells
  whether another process took the cores during a timed run.
"""

from .compare import Comparison, compare
from .measure import RunResult, measure
from .timing import TimingStreamer

__all__ = ["Comparison", "RunResult", "TimingStreamer", "compare", "measure"]
