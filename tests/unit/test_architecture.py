"""The package's shape: the public API, the deprecated names, and the import contracts' coverage."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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
    raised = []
    for path in sorted((ROOT / "hf_triforce").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id in BUILTIN_ERRORS:
                    raised.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.exc.func.id}")
    assert raised == ["hf_triforce/bench/results.py:55 TypeError"], raised


def test_import_loads_neither_torch_nor_transformers_until_a_name_is_used():
    """``import hf_triforce`` is cheap (``hf-triforce --help`` stays fast); the first public name loads the package,
    transformers' version check and the enable() hint with it."""
    code = (
        "import sys, hf_triforce\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
        "from hf_triforce import TriForceConfig\n"
        "from transformers.generation.utils import GenerationMixin\n"
        "print(getattr(GenerationMixin._validate_model_kwargs, '_hf_triforce_hint', False))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.split("\n")[:2] == ["[]", "True"], done.stdout + done.stderr


def test_the_lazy_exports_are_the_public_api():
    assert sorted(hf_triforce._EXPORTS) == sorted(hf_triforce.__all__)
    assert set(dir(hf_triforce)) >= set(hf_triforce.__all__)


BENCH_LINES = 3700
"""hf_triforce/bench holds what hf-triforce bench, demo and estimate run, at most this many lines (issue 78: the
product, not the lab; research/ holds the rest, outside the wheel)."""


def test_the_bench_package_is_the_product_not_the_lab():
    lines = sum(len(path.read_text().splitlines()) for path in (ROOT / "hf_triforce" / "bench").glob("*.py"))
    assert lines <= BENCH_LINES, lines
    for path in (ROOT / "hf_triforce").rglob("*.py"):  # nothing in the package reaches into research/
        tree = ast.parse(path.read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.split(".")[0] == "research"], path
    packaging = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert packaging["include"] == ["hf_triforce*"] and "research*" in packaging["exclude"]


def test_python_requirement_and_tests_agree():
    """The tests read pyproject.toml with tomllib, which Python 3.11 added: the package asks for 3.11 or newer."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    assert all(
        "triton==" not in extra.replace(" ", "") for extra in project["project"]["optional-dependencies"]["triton"]
    )
