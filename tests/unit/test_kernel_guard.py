"""first_launch_guard: a kernel that cannot compile falls back to its (lossless) reference, once and loudly."""

from __future__ import annotations

import logging

import pytest

from hf_triforce.kernels import guard

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(guard, "_BROKEN", set())
    monkeypatch.setattr(guard, "_WORKING", set())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _failing(calls):
    def kernel():
        calls.append("kernel")
        raise RuntimeError("PassManager::run failed")

    return kernel


def test_a_first_launch_failure_falls_back_for_good(caplog):
    calls = []
    with caplog.at_level(logging.WARNING, logger=guard.__name__):
        assert guard.first_launch_guard("k", _failing(calls), lambda: "reference") == "reference"
        assert guard.first_launch_guard("k", _failing(calls), lambda: "reference") == "reference"
    assert calls == ["kernel"], "a broken kernel is not tried again"
    assert len(caplog.records) == 1 and "PassManager::run failed" in caplog.text and "pure-torch" in caplog.text


def test_errors_after_a_good_first_launch_propagate():
    assert guard.first_launch_guard("k", lambda: 1, lambda: 2) == 1
    with pytest.raises(RuntimeError, match="PassManager"):
        guard.first_launch_guard("k", _failing([]), lambda: 2)


def test_nothing_is_caught_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    with pytest.raises(RuntimeError, match="PassManager"):
        guard.first_launch_guard("k", _failing([]), lambda: 2)
