"""When the Triton kernels run: on CUDA tensors, with Triton importable, unless ``HF_TRIFORCE_DISABLE_TRITON=1``;
otherwise each dispatcher runs the kernel's pure-torch reference (always on the CPU)."""

from __future__ import annotations

import functools
import logging
import os

import torch

from ..errors import InvalidInputError

logger = logging.getLogger(__name__)

DISABLE_ENV = "HF_TRIFORCE_DISABLE_TRITON"
_TRUE = {"1", "true", "yes", "on"}


def triton_enabled(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels serve these tensors: all on CUDA, Triton importable, not disabled.

    Example:
        >>> triton_enabled(torch.zeros(2))  # a CPU tensor: always the torch reference
        False
    """
    if not tensors or not all(t.is_cuda for t in tensors):
        return False
    if os.environ.get(DISABLE_ENV, "").strip().lower() in _TRUE:
        return False
    return _triton_importable()


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install: fall back, say so once
        logger.warning("Triton unavailable (%s): hf_triforce uses its pure-torch kernels.", exc)
        return False
    return True


def interpreting() -> bool:
    """Whether ``triton.jit`` would build interpreted kernels now (``TRITON_INTERPRET``)."""
    import triton

    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; older releases read the variable directly
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def check_device(what: str, *tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``tensors`` share one device that ``what`` (a Triton entry point) can run on."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise InvalidInputError(f"{what} needs all tensors on one device, got {sorted(map(str, devices))}.")
    if not tensors[0].is_cuda and not interpreting():
        raise InvalidInputError(f"{what} needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors).")
