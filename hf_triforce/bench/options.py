"""The named choices the commands offer, importable without torch or transformers: ``hf-triforce --help`` reads
them before anything heavy loads.

Example:
    >>> DEFAULT_PLAIN[0], ATTN_CHOICES[0], sorted(DTYPE_BYTES)
    ('dynamic', 'auto', ['bfloat16', 'float16', 'float32'])
"""

DEFAULT_PLAIN = ("dynamic", "static", "static_compiled", "sdpa_flash", "flash_attention_2", "continuous_batching")
"""The plain decodings the bench times by default (:mod:`.plain_decoding`; the CUDA-only ones are reported as not run
on a CPU)."""
ATTN_CHOICES = ("auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3")
"""``--attn-implementation`` values (:func:`~hf_triforce.bench.backend.preferred_attn_implementation`)."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
"""``hf-triforce estimate --dtype`` values and their bytes per element."""
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
"""Other spellings ``--dtype`` accepts."""
