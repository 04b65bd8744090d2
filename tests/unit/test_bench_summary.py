"""The bench's headline figures: medians over prompts against best plain, loops left out."""

from __future__ import annotations

import pytest

from hf_triforce.bench.headline import headline_section
from hf_triforce.bench.repetition import loops
from hf_triforce.bench.summary import summarize
from tests.support.bench_rows import bench_row as row

pytestmark = pytest.mark.unit


def test_medians_are_over_the_prompts_whose_answers_do_not_loop():
    rows = [row("a", 0.0, 1.0, 0.8, 0.5), row("b", 0.0, 1.0, 1.2, 0.25), row("c", 0.0, 1.0, 0.9, 0.1, looping=True)]
    rows += [row("a", 0.6, 1.0, 0.8, 0.4)]
    (greedy, sampled) = summarize(rows)
    assert greedy["prompts"] == 2 and greedy["left_out"] == ["c"]
    assert greedy["median_speedup_best_plain"] == pytest.approx((0.8 / 0.5 + 1.0 / 0.25) / 2)
    assert greedy["median_speedup_default"] == pytest.approx((2.0 + 4.0) / 2)
    assert greedy["best_plain"] == ["static", "dynamic"] and greedy["identical"] == 2
    assert sampled["temperature"] == 0.6 and sampled["identical"] is None and sampled["prompts"] == 1


def test_every_answer_looping_leaves_no_median():
    (entry,) = summarize([row("a", 0.0, 1.0, 1.0, 0.5, looping=True)])
    assert entry["prompts"] == 0 and "median_speedup_best_plain" not in entry
    assert "every answer looped (a)" in "\n".join(headline_section({"rows": [], "summary": [entry]}))


def test_the_page_flags_loops_and_reports_configurations_that_did_not_run():
    rows = [row("a", 0.0, 1.0, 0.8, 0.5), row("c", 0.0, 1.0, 0.9, 0.1, looping=True)]
    lines = headline_section({"rows": rows, "summary": summarize(rows)})
    page = "\n".join(lines)
    assert "1.60x best plain" in page and "left out (answers loop): c" in page
    a, c = (line for line in lines if line.startswith(("| a |", "| c |")))
    assert "| static |" in a and "| n/a |" in a and "1.60x" in a and "no (0%)" in a
    assert "**loops** (60%)" in c


def test_an_answer_loops_when_more_than_a_quarter_of_its_spans_repeat():
    assert not loops(list(range(100)))
    assert loops(list(range(12)) * 3)
    assert not loops(list(range(80)) + list(range(10)))  # one repeated passage: 3 of 83 spans
