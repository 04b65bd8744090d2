"""The project's research tools, outside the package (setuptools packages ``hf_triforce`` only): what its own
measurements need and a user's do not. Run from the repository root, e.g. ``python -m research.lab_bench --help``.

* :mod:`.lab_bench`: ``hf-triforce bench`` plus random-weights shapes, tensor parallelism, batches, profiles, figures
  and the modeled speedups of the GPU runs (``benchmarks/gpu_run.sh`` drives it on a GPU);
* :mod:`.memory_peak`, :mod:`.memory_fit`: the peak memory of plain and TriForce calls, and whether a run fits a GPU.

Their tests run with the package's (``tests/research/``); nothing in ``hf_triforce`` imports from here.
"""
