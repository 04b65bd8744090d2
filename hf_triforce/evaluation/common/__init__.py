"""The helpers every part of the evaluation shares, each in one module.

* :mod:`.loading` and :mod:`.smollm2`: the model (the embedded SmolLM2-135M-Instruct, or a local directory);
* :mod:`.documents`: the default long document and the question prompt;
* :mod:`.generate_kwargs`: ``generate()`` arguments at a temperature;
* :mod:`.results`: writing results and reading recorded ones (one loader, which upgrades 0.1 stats names);
* :mod:`.machine`: the machine record of every result; :mod:`.formatting`: how numbers are printed.
"""
