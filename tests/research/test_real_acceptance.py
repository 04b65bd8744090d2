"""Real-text acceptance for the modeled speedup of random-weights runs, read from an eval-drafts result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.real_acceptance import DEFAULT_PATH, parse_real_acceptance, real_acceptance

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parents[2] / DEFAULT_PATH


def _view(fraction, temperature, accepted, positions, kind="retrieval", task_kind="natural", group="main"):
    return dict(budget_fraction=fraction, budget=int(4096 * fraction), temperature=temperature, kind=kind,
                task_kind=task_kind, group=group, accepted_sum=accepted, positions=positions)  # fmt: skip


@pytest.fixture
def results_file(tmp_path):
    views = [
        _view(1 / 16, 0.0, 8.0, 10),
        _view(1 / 16, 0.0, 10.0, 10),  # pooled with the row above: 18 / 20
        _view(1 / 4, 0.0, 5.0, 10),
        _view(1 / 16, 0.6, 7.0, 10),
        _view(1 / 16, 0.0, 0.0, 10, kind="streaming"),  # other view kinds, tasks and groups are ignored
        _view(1 / 16, 0.0, 0.0, 10, task_kind="needle"),
        _view(1 / 16, 0.0, 0.0, 10, group="ablation"),
    ]
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"model_name": "M", "options": {"context_tokens": 4096}, "views": views}))
    return str(path)


def test_nearest_budget_fraction_and_temperature(results_file):
    got = real_acceptance(results_file, budget=4096, context=122880, temperature=0.0)  # 1/30: nearest 1/16
    assert got.level1 == pytest.approx(0.9)
    assert "budget 256 of 4096 tokens (1/16), T=0, 20 positions" in got.source
    assert real_acceptance(results_file, 1024, 4096, 0.0).level1 == pytest.approx(0.5)
    assert real_acceptance(results_file, 256, 4096, 0.7).level1 == pytest.approx(0.7)  # nearest T: 0.6


def test_recorded_results_give_the_published_table():
    """The recorded eval-drafts result gives its own eval-drafts.md's natural-text figure at budget 1/16, T=0."""
    rows = RECORDED.with_suffix(".md").read_text().splitlines()
    published = float(next(row for row in rows if row.startswith("| 256 (1/16) |")).split("|")[2])
    assert real_acceptance(str(RECORDED), 4096, 131072, 0.0).level1 == pytest.approx(published, abs=5e-4)


def test_not_an_eval_drafts_result(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"views": [], "options": {}}))
    with pytest.raises(ValueError, match="no natural-text retrieval rows"):
        real_acceptance(str(path), 512, 4096, 0.0)


def test_parse_option(results_file, tmp_path, monkeypatch):
    assert parse_real_acceptance("0.85", None) == 0.85
    assert parse_real_acceptance(results_file, "llama2-7b") == results_file
    for bad, message in (("1.5", r"in \(0, 1\]"), ("0", r"in \(0, 1\]"), ("nope.json", "no such file")):
        with pytest.raises(ValueError, match=message):
            parse_real_acceptance(bad, None)
    monkeypatch.chdir(tmp_path)  # no recorded results here: nothing by default
    assert parse_real_acceptance(None, "llama2-7b") is None
    (tmp_path / DEFAULT_PATH).parent.mkdir(parents=True)
    (tmp_path / DEFAULT_PATH).write_text("{}")
    assert parse_real_acceptance(None, "llama2-7b") == str(DEFAULT_PATH)  # random weights: the recorded file
    assert parse_real_acceptance(None, None) is None  # a real model measures its own acceptance
