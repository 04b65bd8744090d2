"""eval-drafts' natural-text check: the pooled margin against StreamingLLM and how it splits over the prompts.

The check itself is unchanged (retrieval >= StreamingLLM pooled, at every budget and temperature); the report adds
the margin in positions, the per-prompt spread and a bootstrap interval of the margin over the prompts, so that a
margin of a few positions can be read against the prompt-to-prompt noise (issue 18's natural-text item).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_triforce.evaluation.drafts.report import _verdict_section
from hf_triforce.evaluation.drafts.summary import margin_interval, prompt_margins, verdicts

pytestmark = pytest.mark.unit


def _row(task: str, kind: str, accepted: float, t: float = 0.0) -> dict:
    return dict(task=task, task_kind="natural", kind=kind, group="main", budget_fraction=0.125, temperature=t,
                accepted_sum=accepted, positions=63)  # fmt: skip


def _results(pairs: list[tuple[float, float]]) -> dict:
    views = []
    for i, (r, s) in enumerate(pairs):
        views += [_row(f"natural#{i}", "retrieval", r), _row(f"natural#{i}", "streaming", s)]
    options = dict(headline_fraction=0.125, needle_depths=[], budget_fractions=[0.125], temperatures=[0.0])
    return {"views": views, "options": options, "tasks": [{"kind": "natural"}]}


def test_prompt_margins_pair_each_prompts_two_views():
    rows = [_row("a", "retrieval", 60), _row("a", "streaming", 62), _row("b", "retrieval", 50),
            _row("b", "streaming", 47), _row("c", "retrieval", 40)]  # fmt: skip
    assert prompt_margins(rows) == [-2.0, 3.0]  # "c" has no StreamingLLM row: not a pair
    assert prompt_margins(rows, temperature=0.6) == []


def test_verdict_keeps_the_pooled_rule_and_reports_the_spread():
    v = verdicts(_results([(60, 62), (50, 47), (55, 55)]))["natural"]["0.125@T=0"]
    assert v["prompt_margins"] == [-2.0, 3.0, 0.0] and v["positions"] == 189
    assert v["retrieval"] == pytest.approx(165 / 189) and v["streaming"] == pytest.approx(164 / 189)
    line = _verdict_section(_results([(60, 62), (50, 47), (55, 55)]))[-1]
    assert "**met**" in line
    assert ": +1 of 189 positions; per prompt ahead on 1, behind on 1, even on 1, from -2 to +3 positions" in line
    behind = _verdict_section(_results([(60, 62), (55, 55)]))[-1]
    assert "**NOT met**" in behind and "-2 of 126 positions" in behind


def test_one_prompt_behind_reads_as_the_whole_margin():
    results = _results([(60, 62)])
    line = _verdict_section(results)[-1]
    assert line.endswith("(smallest margin -0.032 at budget 0.125@T=0: -2 of 63 positions; per prompt ahead on 0, "
                         "behind on 1, even on 0, from -2 to -2 positions).")  # fmt: skip


def test_expected_positions_at_a_temperature_keep_a_decimal():
    line = _verdict_section(_results([(60.25, 60.5), (50.0, 50.0)]))[-1]
    assert ": -0.2 of 126 positions; per prompt ahead on 0, behind on 1, even on 1, from -0.2 to +0.0 positions" in line


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=1, max_size=16))
def test_margin_interval_lies_within_what_resampling_can_reach(margins):
    low, high = margin_interval([float(m) for m in margins], draws=500)
    n = len(margins)
    assert n * min(margins) <= low <= high <= n * max(margins)
    assert (low, high) == margin_interval([float(m) for m in margins], draws=500)  # seeded: a report renders the same


def test_margin_interval_of_equal_margins_is_their_sum_and_noise_straddles_zero():
    assert margin_interval([2.0] * 5) == (10.0, 10.0)
    low, high = margin_interval([-3.0, 2.0, 1.0, -2.0, 3.0, -1.0, 0.0, 1.0])
    assert low < 0 < high  # prompts that trade a few positions either way: either view could lead
    low, high = margin_interval([5.0, 6.0, 4.0, 7.0, 5.0, 6.0])
    assert low > 0  # every prompt ahead: the interval stays above zero


@pytest.mark.parametrize("margins, level", [([], 0.95), ([1.0], 1.0), ([1.0], 0.0)])
def test_margin_interval_refuses_what_it_cannot_resample(margins, level):
    with pytest.raises(ValueError, match="at least one margin"):
        margin_interval(margins, level)


def test_report_adds_the_interval_from_three_prompts():
    three = _verdict_section(_results([(60, 62), (50, 47), (55, 55)]))[-1]
    low, high = margin_interval([-2.0, 3.0, 0.0])
    assert three.endswith(f"; the prompts resampled, 95 % of the margins lie from {low:+.0f} to {high:+.0f}).")
    two = _verdict_section(_results([(60, 62), (55, 55)]))[-1]
    assert "resampled" not in two
