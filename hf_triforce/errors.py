"""Typed errors. Each is a ``ValueError`` so ``except ValueError`` keeps working."""


class TriForceError(ValueError):
    """Base class of hf_triforce's errors; the message says what was wrong and what to do."""


class TriForceConfigError(TriForceError):
    """A ``TriForceConfig`` value is invalid (budget, chunk size, gammas, ...)."""


class UnsupportedModelError(TriForceError):
    """The model family or attention setup is not supported by hf_triforce."""


class UnsupportedGenerationError(TriForceError):
    """The requested ``generate()`` options cannot be served losslessly by TriForce."""


class UnsupportedDeviceError(TriForceError):
    """A requested device feature (e.g. ``cuda_graphs=True``) is not available where the model lives."""


class NoStatsError(TriForceError):
    """:func:`hf_triforce.last_stats` has no call to report (none ran, or the latest one raised)."""


class EstimateInputError(TriForceError):
    """An input of ``hf-triforce estimate`` is invalid: an unknown GPU, a context of no tokens, an unknown dtype, or a
    model that is not a local directory or ``config.json`` (the estimate downloads nothing)."""
