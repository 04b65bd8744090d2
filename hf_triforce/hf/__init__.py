"""The boundary with transformers: every touch of its internals, and every per-version difference, lives here.

:mod:`.versions` holds the supported range (checked at import) and the names that changed between releases. The
rest of hf_triforce uses transformers' public API only (``Cache``, ``CacheLayerMixin``, logits processors, stopping
criteria); import-linter checks that nothing outside this package imports its private modules.
"""

from . import versions  # noqa: F401  (the version gate runs on import)
