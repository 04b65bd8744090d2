"""Typed errors. Each is a ``ValueError`` so ``except ValueError`` keeps working."""


class TriForceConfigError(ValueError):
    """A ``TriForceConfig`` value is invalid (budget, chunk size, gammas, ...)."""


class UnsupportedModelError(ValueError):
    """The model family or attention setup is not supported by hf_triforce."""


class UnsupportedGenerationError(ValueError):
    """The requested ``generate()`` options cannot be served losslessly by TriForce."""
