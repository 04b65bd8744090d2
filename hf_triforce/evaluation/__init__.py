"""Measuring hf_triforce: end-to-end benchmark, draft quality, analytical models, figures.

* :mod:`.bench`: plain ``generate()`` against TriForce in one process (``hf-triforce bench``, ``make tuning``);
* :mod:`.drafts`: draft quality of levels 0 and 1 on real long context (``hf-triforce eval-drafts``);
* :mod:`.models`: analytical models: peak memory, the bandwidth floor and modeled speedup, model shapes;
* :mod:`.figures`: the ``--plot`` figures and the docs' tables and figures (``make plots``);
* :mod:`.common`: what they all share, once: model loading, documents and prompts, ``generate()`` arguments,
  result files, the machine record, number formatting.

It sits above the core (``cli, demo -> evaluation -> generation -> hierarchy -> caches -> kernels``) and imports
neither ``cli`` nor ``demo``.
"""
