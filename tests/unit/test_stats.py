"""TriForceStats: one vocabulary for the levels, and the 0.1 names as deprecated aliases."""

from __future__ import annotations

import json

import pytest

from hf_triforce import TriForceStats
from hf_triforce.stats import LEVEL_ALIASES, PHASE_ALIASES, AliasedDict, upgrade_stats_dicts

pytestmark = pytest.mark.unit


def _stats() -> TriForceStats:
    stats = TriForceStats()
    stats.level0.record(4, 3)
    stats.level1.record(6, 5)
    for phase in ("prefill", "level0", "level1", "refresh", "level2"):
        with stats.phases.measure(phase):
            pass
    return stats


def test_to_dict_uses_the_level_vocabulary_only():
    d = json.loads(json.dumps(_stats().to_dict()))
    assert set(d["levels"]) == {"level0", "level1", "level0_to_level2"}
    assert set(d["phases"]) == {"prefill", "level0", "level1", "refresh", "level2"}
    assert d["levels"]["level1"] == {"drafted": 6, "accepted": 5, "acceptance_rate": 5 / 6}


@pytest.mark.parametrize(("old", "new"), sorted(LEVEL_ALIASES.items()))
def test_old_level_keys_resolve_with_a_warning(old, new):
    levels = _stats().to_dict()["levels"]
    with pytest.warns(FutureWarning, match=f"'{old}' is now '{new}'"):
        assert levels[old] == levels[new]
    with pytest.warns(FutureWarning):
        assert levels.get(old) == levels[new]


@pytest.mark.parametrize(("old", "new"), sorted(PHASE_ALIASES.items()))
def test_old_phase_keys_resolve_with_a_warning(old, new):
    phases = _stats().to_dict()["phases"]
    with pytest.warns(FutureWarning):
        assert phases[old] == phases[new]


def test_old_attributes_resolve_with_a_warning():
    stats = _stats()
    with pytest.warns(FutureWarning, match="'draft' is now 'level0'"):
        assert stats.draft is stats.level0
    with pytest.warns(FutureWarning, match="'retrieval' is now 'level1'"):
        assert stats.retrieval is stats.level1


def test_unknown_keys_still_raise():
    d = AliasedDict({"a": 1}, {"b": "a"})
    with pytest.raises(KeyError):
        d["c"]
    assert d.get("c", 7) == 7


def test_recorded_01_results_are_upgraded():
    old = {
        "rows": [
            {
                "triforce": {
                    "levels": {"draft": {"drafted": 1}, "retrieval": {"drafted": 2}},
                    "phases": {"verify": {"calls": 3}, "draft": {"calls": 4}, "level1": {"calls": 5}},
                }
            }
        ]
    }
    new = upgrade_stats_dicts(old)["rows"][0]["triforce"]
    assert new["levels"] == {"level0": {"drafted": 1}, "level1": {"drafted": 2}}
    assert new["phases"] == {"level2": {"calls": 3}, "level0": {"calls": 4}, "level1": {"calls": 5}}
