"""The boundary with transformers: every touch of its internals, and every per-version difference, lives here.

* :mod:`.versions`: the supported range (checked at import) and the names that changed between releases (the
  cache argument: ``past_key_values`` before 5.24, ``cache`` since);
* :mod:`.attention`: query capture and attention routing through ``AttentionInterface``;
* :mod:`.masks`: which mask function an attention implementation uses;
* :mod:`.processors`: which logits processors ignore the context, and ``prefix_allowed_tokens_fn``'s batch index;
* :mod:`.model`: supported families and what is read off a model (layers, rotary embedding, vocabulary);
* :mod:`.generate`: the hook into ``generate()`` (``custom_generate``), its outputs and stop strings;
* :mod:`.linears`: the CPU few-row linear patch; :mod:`.progress`: prefill progress bars (and silencing them);
* :mod:`.distributed`: a tensor-parallel model's process group, and rank 0's decisions broadcast to every rank.

The rest of hf_triforce uses transformers' public API only (``Cache``, ``CacheLayerMixin``, logits processors,
stopping criteria); import-linter checks that nothing outside this package imports its private modules.
"""

from . import versions  # noqa: F401  (the version gate runs on import)
