"""The boundary with transformers: every touch of its internals, and every per-version difference (:mod:`.versions`),
lives here; import-linter checks that nothing outside this package imports its private modules."""

from . import versions  # noqa: F401  (the version gate runs on import)
from .generate import install_enable_hint

install_enable_hint()  # generate(triforce_config=...) before enable(): an error that names hf_triforce.enable(model)
