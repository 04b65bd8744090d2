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


class NotEnabledError(TriForceError):
    """``generate()`` got ``triforce_config`` on a model :func:`hf_triforce.enable` was not called on (or was undone
    on): the message says to call ``hf_triforce.enable(model)`` first."""


class NoStatsError(TriForceError):
    """:func:`hf_triforce.last_stats` has no call to report (none ran, or the latest one raised)."""


class InvalidInputError(TriForceError):
    """A function got an argument it cannot take (a tensor's shape, dtype or device, a count); the message says what
    it expects."""


class InternalError(TriForceError):
    """A step broke an invariant that the call's plan guarantees: a bug in hf_triforce; please report it with the
    call that raised it."""
