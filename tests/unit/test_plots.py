"""``hf_triforce.evaluation.figures.plots``: the docs' figures and tables regenerate from the recorded results."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_triforce.evaluation.common.machine import device_line
from hf_triforce.evaluation.common.results import read_results
from hf_triforce.evaluation.figures.demo_page import write_demo
from hf_triforce.evaluation.figures.drafts_page import demote_headings
from hf_triforce.evaluation.figures.plots import generate_all, kind_of

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_kinds():
    assert kind_of({"rows": [{"knob": "gamma2"}]}) == "tuning"
    assert kind_of({"rows": [{"speedup": 1.0, "plain": {}}]}) == "bench"
    assert kind_of({"views": [], "options": {}}) == "eval-drafts"
    assert kind_of({"kind": "demo", "rows": [{"speedup": 1.0, "plain": {}}]}) == "demo"
    assert kind_of({"rows": []}) is None
    assert kind_of([1, 2]) is None


def test_demote_headings_leaves_code_alone():
    assert demote_headings("# A\n```\n# not a heading\n```\ntext", 1) == "## A\n```\n# not a heading\n```\ntext"


def test_recorded_bench_results_regenerate(tmp_path):
    pytest.importorskip("matplotlib")
    written = generate_all(RESULTS, tmp_path)
    names = {p.name for p in written}
    assert {"cpu-smollm2-7k.md", "cpu-smollm2-7k-speed.png", "cpu-smollm2-7k-phases.png"} <= names
    assert "data" in {p.parent.name for p in written}
    for path in written:
        assert path.stat().st_size > 0
    results = read_results(RESULTS / "cpu-smollm2-7k.json")
    table = (tmp_path / "cpu-smollm2-7k.md").read_text()
    assert table.startswith(device_line(results))
    assert "| 7069 | 0.0 | ngram | 512 |" in table


def test_recorded_demo_results_regenerate(tmp_path):
    """Each recorded demo has a greedy row with identical text and a sampled row, and its table shows both."""
    demos = sorted(RESULTS.glob("cpu-smollm2-demo-*.json"))
    assert len(demos) >= 3, "the demo is recorded on several documents"
    for path in demos:
        results = read_results(path)
        (page,) = write_demo(results, tmp_path, path.stem)
        table = page.read_text()
        assert table.startswith(device_line(results)) and table.count("\n| ") == 1 + len(results["rows"])
        temperatures = [row["temperature"] for row in results["rows"]]
        assert 0.0 in temperatures and any(t > 0 for t in temperatures), path
        assert all(row["identical_output"] for row in results["rows"] if row["temperature"] == 0), path
