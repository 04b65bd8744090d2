"""``benchmarks/modeled_hybrids.py``: the record the FAQ quotes is what the script prints today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_is_the_script_s_output(capsys):
    spec = importlib.util.spec_from_file_location("modeled_hybrids", ROOT / "benchmarks" / "modeled_hybrids.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    recorded = [line for line in (ROOT / "benchmarks/results/modeled-hybrids.md").read_text().splitlines()
                if line.startswith("| ")]  # fmt: skip
    assert printed == recorded and len(printed) == 1 + 2 * len(module.SHAPES)
    mistral = [line for line in printed if line.startswith("| Mistral")]
    assert all("(100%)" in line for line in mistral)  # every layer slides within the view: level 1 reads a plain step
