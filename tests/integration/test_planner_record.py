"""The planner's record through ``generate()``: after a call ``last_stats(model).to_dict()["planner"]`` says what
the schedule weighed and why it settled where it did, and the greedy output is still plain ``generate()``'s."""

from __future__ import annotations

import json

import pytest

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hierarchy.planner import SCHEDULE_MARGIN

pytestmark = pytest.mark.integration

SMALL = dict(retrieval_budget=64, chunk_size=8, recent_window=16, refresh_every=4, gamma1=2, gamma2=6)
SCHEDULE_KEYS = {
    "rounds", "measured_ms_per_token", "modeled_ms_per_token", "gamma2", "expected_tokens", "acceptance",
    "measured_tokens_per_round",
}  # fmt: skip


def test_an_adaptive_call_explains_its_schedule(llama, make_prompt, assert_greedy_equal):
    prompt = make_prompt(300, seed=5, repetitive=True)
    assert_greedy_equal(llama, prompt, TriForceConfig(drafter="ngram", **SMALL), 40)
    stats = hf_triforce.last_stats(llama)
    record = json.loads(json.dumps(stats.to_dict()))["planner"]
    assert record == stats.planner
    assert {"adaptive", "chosen", "reason", "rounds", "decisions", "probes", "switches", "modeled_at_round",
            "stops_by_confidence", "context_tokens", "schedules"} <= set(record)  # fmt: skip
    assert record["adaptive"] and not record["stops_by_confidence"] and record["context_tokens"] >= 300 + 39  # greedy
    assert set(record["schedules"]) == {"levels", "level0", "plain"}
    for kind, entry in record["schedules"].items():
        assert SCHEDULE_KEYS <= set(entry) and entry["rounds"] == stats.rounds.get(kind, 0)
    assert record["rounds"] == sum(stats.rounds.values()) == record["decisions"] + record["probes"]
    assert {"shape", "gamma1"} <= set(record["schedules"]["levels"])
    if record["chosen"] is not None:
        modeled = {k: e["modeled_ms_per_token"] for k, e in record["schedules"].items()}
        margin = {kind: 1.0 if kind == "levels" else SCHEDULE_MARGIN for kind in modeled}  # others must win by it
        assert modeled[record["chosen"]] * margin[record["chosen"]] == min(
            m * margin[k] for k, m in modeled.items() if m is not None
        )
        assert record["reason"].startswith(record["chosen"]) and "tokens of context" in record["reason"]
    timed = [e["measured_ms_per_token"] for e in record["schedules"].values() if e["measured_ms_per_token"]]
    assert timed and all(ms > 0 for ms in timed)
    lines = stats.schedule_summary.split("\n")
    assert len(lines) == 2 and lines[0].startswith("schedule: levels ") and lines[1] == f"why: {record['reason']}"


def test_a_fixed_schedule_says_so(llama, make_prompt, assert_greedy_equal):
    assert_greedy_equal(llama, make_prompt(200, seed=6), TriForceConfig(drafter="none", adaptive=False, **SMALL), 16)
    record = hf_triforce.last_stats(llama).planner
    assert record["chosen"] == "levels" and record["decisions"] == 0 and set(record["schedules"]) == {"levels", "plain"}
    assert record["reason"].startswith("fixed schedule (adaptive=False): levels (gamma2 6")
    assert record["schedules"]["levels"]["rounds"] == hf_triforce.last_stats(llama).rounds["levels"]
