"""What users run to measure TriForce: ``hf-triforce bench`` and ``hf-triforce demo`` (the commands: ``cli.py``,
``demo.py``), one concept per module.

The benchmark:

* :mod:`.run` sweeps prompts, prompt lengths, temperatures, budgets, drafters and tree budgets (``hf-triforce bench``;
  :class:`~.run.BenchOptions`); :mod:`.batch` is its ``--batch-size N`` form;
* :mod:`.comparison` runs plain ``generate()`` then TriForce (and optionally prompt lookup) on one prompt;
  :mod:`.plain_baselines` times each plain decoding (the fastest is "best plain") from one prefill (:mod:`.prefix`);
  :mod:`.timed_run` times one call (prefill and decode apart, :mod:`.timing_streamer`); :mod:`.profile` adds
  torch.profiler's operators per phase; :mod:`.questions` asks several questions of one prefilled document;
* :mod:`.report` writes the JSON and the markdown tables, through :mod:`.summary` and :mod:`.headline` (the
  headline), :mod:`.schedule_table` and :mod:`.divergence` (where greedy texts differ, and whether it is a near-tie);
  :mod:`.plot` draws ``--plot`` (matplotlib, the ``bench`` extra);
* ``--tp N`` under ``torchrun``: :mod:`.tp_launch` checks the launch before loading, :mod:`.sharding` loads the model
  sharded, :mod:`.rank_figures` gathers each rank's figures on rank 0, :mod:`.rank_report` tables them;
* ``--preset`` (random weights of a model's shape) and the GPU columns: :mod:`.shapes`, the bandwidth floor and
  modeled speedup (:mod:`.bandwidth`, with the real-text acceptance of :mod:`.real_acceptance`), the memory model
  (:mod:`.memory`) and whether a row fits the GPU (:mod:`.memory_fit`).

What the benchmark and the demo share: the model (:mod:`.loading`, the embedded SmolLM2 in :mod:`.smollm2`), the
documents and questions (:mod:`.documents`, :mod:`.prompt_set`, :mod:`.haystacks`), ``generate()`` arguments
(:mod:`.generate_kwargs`), the answer's repetition (:mod:`.repetition`), the machine record (:mod:`.machine`),
result files (:mod:`.results`) and how numbers are printed (:mod:`.formatting`).

It sits above the core (``cli -> demo -> bench -> generation -> hierarchy -> caches -> kernels``) and imports neither
``cli`` nor ``demo``.
"""
