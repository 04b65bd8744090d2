"""Fixtures of the unit tier."""

from __future__ import annotations

import pytest


@pytest.fixture
def triton_mode(request, monkeypatch):
    """Triton's interpreter for CPU tests, compiled kernels for ``gpu``-marked ones; Triton never disabled.

    Use with ``pytest.mark.usefixtures("triton_mode")`` in the kernel test modules.
    """
    monkeypatch.delenv("HF_TRIFORCE_DISABLE_TRITON", raising=False)
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
