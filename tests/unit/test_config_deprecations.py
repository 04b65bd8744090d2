"""The ``TriForceConfig`` fields deprecated in 0.2 (issue 52, "every knob earns its place"): each still takes effect
until hf_triforce 0.3 removes it, a value other than its default warns once (constructor and ``from_dict``) with
what replaces it, its default is silent, and ``to_dict``/``from_dict`` round-trip either way."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from pathlib import Path

import pytest

from hf_triforce import TriForceConfig

pytestmark = pytest.mark.unit

NON_DEFAULT = {
    "lookahead_chunks": 0,
    "step_selection": True,
    "level1_forward": "transformers",
    "confidence_stops": False,
    "draft_sinks": 4,
    "refresh_below_acceptance": 1.0,
    "ngram_max": 4,
    "ngram_min": 2,
    "suffix_min_match": 2,
    "draft_acceptance_floor": 0.0,
}
"""Every deprecated field with a valid value other than its default."""

KEPT = {
    "retrieval_budget",
    "chunk_size",
    "recent_window",
    "rescore_candidates",
    "level1_weights",
    "gamma1",
    "gamma2",
    "adaptive",
    "draft_cache_budget",
    "refresh_every",
    "drafter",
    "prefill_chunk_size",
    "cuda_graphs",
    "offload_kv",  # issue 54: the cache in host memory where it does not fit the GPU
    "tree_budget",  # issue 53: token trees where a verification's width is nearly free (docs/trees.md)
}
"""The fields kept, each for a measured setting (docs/tuning.md, "Every knob")."""

FIELDS = {f.name: f for f in dataclasses.fields(TriForceConfig)}
ROOT = Path(__file__).resolve().parents[2]


def future_warnings(make) -> tuple[object, list[warnings.WarningMessage]]:
    """``make()`` and the ``FutureWarning``s it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = make()
    return made, [w for w in caught if issubclass(w.category, FutureWarning)]


def test_every_field_is_kept_or_deprecated():
    assert set(TriForceConfig.deprecated_fields()) == set(NON_DEFAULT)
    assert set(FIELDS) == KEPT | set(NON_DEFAULT) and not KEPT & set(NON_DEFAULT)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_a_deprecated_field_warns_once_and_still_takes_effect(name):
    value = NON_DEFAULT[name]
    with pytest.warns(FutureWarning, match=rf"^{name}=.*removed in hf_triforce 0\.3") as record:
        config = TriForceConfig(**{name: value})
    assert getattr(config, name) == value  # honoured until 0.3, never ignored
    assert len(record) == 1
    message = str(record[0].message)
    assert TriForceConfig.deprecated_fields()[name] in message  # what replaces it
    assert record[0].filename == __file__  # points at the line that set it


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_a_deprecated_field_at_its_default_is_silent(name):
    default = FIELDS[name].default
    config, caught = future_warnings(lambda: TriForceConfig(**{name: default}))
    assert caught == [] and getattr(config, name) == default


def test_the_defaults_are_silent_and_round_trip_silently():
    config, caught = future_warnings(TriForceConfig)
    assert caught == []
    again, caught = future_warnings(lambda: TriForceConfig.from_dict(config.to_dict()))
    assert caught == [] and again == config


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_a_deprecated_field_round_trips_and_from_dict_warns_too(name):
    with pytest.warns(FutureWarning, match=f"^{name}="):
        config = TriForceConfig(**{name: NON_DEFAULT[name]})
    data = config.to_dict()
    assert data[name] == NON_DEFAULT[name]
    with pytest.warns(FutureWarning, match=f"^{name}=") as record:
        again = TriForceConfig.from_dict(data)
    assert again == config and getattr(again, name) == NON_DEFAULT[name] and len(record) == 1


def test_each_deprecated_field_set_warns_on_its_own():
    with pytest.warns(FutureWarning) as record:
        config = TriForceConfig(draft_sinks=4, confidence_stops=False)
    assert sorted(str(w.message).split("=")[0] for w in record) == ["confidence_stops", "draft_sinks"]
    assert (config.draft_sinks, config.confidence_stops) == (4, False)


def test_an_invalid_deprecated_value_is_refused_before_any_warning():
    from hf_triforce.errors import TriForceConfigError

    (_, caught) = future_warnings(lambda: pytest.raises(TriForceConfigError, TriForceConfig, draft_sinks=-1))
    assert caught == []


def test_the_help_says_which_fields_are_deprecated():
    for name, f in FIELDS.items():
        assert f.metadata["help"].startswith("Deprecated (removed in 0.3): ") == (name in NON_DEFAULT), name


def test_the_config_table_marks_the_deprecated_fields():
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "docs" / "hooks" / "config_table.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    rows = hook.config_table().splitlines()[2:]
    assert len(rows) == len(FIELDS)
    deprecated = {row.split("`")[1] for row in rows if "| **deprecated**, removed in 0.3: " in row}
    assert deprecated == set(NON_DEFAULT)
