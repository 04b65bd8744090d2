"""What ``hf-triforce bench``, ``hf-triforce demo`` and ``hf-triforce estimate`` run (the commands: ``cli.py``,
``demo.py``), one concept per module.

The benchmark:

* :mod:`.run` sweeps prompts, prompt lengths, temperatures, budgets, drafters and tree budgets (``hf-triforce bench``;
  :class:`~.run.BenchOptions`);
* :mod:`.comparison` runs plain ``generate()`` then TriForce (and optionally prompt lookup) on one prompt;
  :mod:`.plain_baselines` times each plain decoding (:mod:`.plain_decoding`; the fastest is "best plain") from one
  prefill (:mod:`.prefix`); :mod:`.timed_run` times one call (prefill and decode apart, :mod:`.timing_streamer`);
  :mod:`.questions` asks several questions of one prefilled document;
* :mod:`.report` writes the JSON and the markdown tables, through :mod:`.summary` and :mod:`.headline` (the
  headline) and :mod:`.divergence` (where greedy texts differ, and whether it is a near-tie).

The estimate: the bandwidth model (:mod:`.bandwidth`), the caches' memory (:mod:`.memory`), the GPUs it knows
(:mod:`.gpus`), a config read without loading anything (:mod:`.local_config`), and :mod:`.estimate` on top.

What the benchmark and the demo share: the model (:mod:`.loading`, :mod:`.backend`, the embedded SmolLM2 in
:mod:`.smollm2`), the documents and questions (:mod:`.documents`, :mod:`.prompt_set`, :mod:`.haystacks`),
``generate()`` arguments (:mod:`.generate_kwargs`), the answer's repetition (:mod:`.repetition`), the machine record
(:mod:`.machine`), result files (:mod:`.results`), the commands' named choices (:mod:`.options`) and how numbers are
printed (:mod:`.formatting`).

It sits above the core (``cli -> demo -> bench -> generation -> hierarchy -> caches -> kernels``) and imports neither
``cli`` nor ``demo``.
"""
