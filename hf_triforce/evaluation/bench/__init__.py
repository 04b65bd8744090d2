"""The end-to-end benchmark: plain ``generate()`` against TriForce, measured in one process (or on every rank).

* :mod:`.timed_run` times one ``generate()`` call (:class:`RunResult`); :mod:`.timing_streamer` its streamer;
* :mod:`.comparison` runs plain then TriForce on the same prompt (:class:`Comparison`);
* :mod:`.run` sweeps prompt lengths, temperatures, budgets and drafters (``hf-triforce bench``);
  :mod:`.report` writes its JSON and markdown; :mod:`.profile` adds a torch.profiler breakdown per phase;
  :mod:`.real_acceptance` is the real-text acceptance of its modeled speedup;
* ``--tp N`` under ``torchrun``: :mod:`.tp_launch` checks the launch before loading, :mod:`.rank_figures` gathers
  each rank's figures on rank 0, :mod:`.rank_report` tables them;
* :mod:`.tuning` sweeps one ``TriForceConfig`` knob at a time (``make tuning``); :mod:`.contention` tells
  whether another process took the cores during a timed run.
"""

from .comparison import Comparison, compare
from .timed_run import RunResult, measure
from .timing_streamer import TimingStreamer

__all__ = ["Comparison", "RunResult", "TimingStreamer", "compare", "measure"]
