"""The package's shape: the public API, the deprecated names, and the import contracts' coverage."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
import tomllib

import hf_triforce

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", hf_triforce.__all__)
def test_every_public_name_imports_and_is_documented(name):
    namespace: dict = {}
    exec(f"from hf_triforce import {name}", namespace)
    obj = namespace[name]
    assert obj is getattr(hf_triforce, name)
    if callable(obj):
        assert obj.__doc__ and obj.__doc__.strip(), f"hf_triforce.{name} has no docstring"


def test_the_01_names_are_gone():
    for name in ("TriForceCandidateGenerator", "SUPPORTED_MODEL_TYPES", "NoSuchName"):
        with pytest.raises(AttributeError):
            getattr(hf_triforce, name)


def _contract(contract_id: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["id"] == contract_id)


def test_boundary_contract_covers_every_module_outside_hf():
    """A new top-level module cannot escape the 'only hf/ imports transformers internals' contract unnoticed."""
    modules = {f"hf_triforce.{m.name}" for m in pkgutil.iter_modules(hf_triforce.__path__)} - {"hf_triforce.hf"}
    assert set(_contract("boundary")["source_modules"]) == modules


def test_layers_name_every_core_package():
    layered = {name.strip() for layer in _contract("layers")["layers"] for name in layer.split("|")}
    packages = {f"hf_triforce.{m.name}" for m in pkgutil.iter_modules(hf_triforce.__path__) if m.ispkg}
    assert packages - {"hf_triforce.hf"} <= layered


def test_core_packages_import_on_their_own():
    """Each layer imports without the package's __init__ having imported the layers above it first."""
    for name in ("kernels", "sampling", "caches", "hierarchy", "generation", "hf", "bench"):
        assert importlib.import_module(f"hf_triforce.{name}")


BUILTIN_ERRORS = {"ValueError", "TypeError", "RuntimeError", "KeyError", "NotImplementedError", "AssertionError"}


def test_every_error_the_package_raises_is_a_triforce_error():
    """A user catches ``hf_triforce.TriForceError`` for everything the package raises (json's ``default`` hook,
    whose protocol is a TypeError, is the one exception)."""
    import ast

    raised = []
    for path in sorted((ROOT / "hf_triforce").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id in BUILTIN_ERRORS:
                    raised.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.exc.func.id}")
    assert raised == ["hf_triforce/bench/results.py:66 TypeError"], raised
