"""A Triton kernel's first launch, its pure-torch reference the way out if it cannot compile (it has written nothing
then); later errors propagate, and under ``TRITON_INTERPRET=1`` (the tests) nothing is caught."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .dispatch import interpreting

logger = logging.getLogger(__name__)

T = TypeVar("T")
_BROKEN: set[str] = set()
_WORKING: set[str] = set()


def first_launch_guard(name: str, kernel: Callable[..., T], reference: Callable[..., T], *args: Any) -> T:
    """``kernel(*args)``, or ``reference(*args)`` if ``kernel``'s first launch in this process raised."""
    if name in _BROKEN:
        return reference(*args)
    if name in _WORKING:
        return kernel(*args)
    try:
        out = kernel(*args)
    except Exception as exc:
        if interpreting():
            raise
        _BROKEN.add(name)
        logger.warning(
            "Triton kernel %s failed on its first launch (%s: %s); using its pure-torch reference from now on "
            "(same results, slower). Please report this with your GPU, torch and triton versions.",
            name, type(exc).__name__, exc,
        )  # fmt: skip
        return reference(*args)
    _WORKING.add(name)
    return out
