"""TriForceConfig: at most 15 fields, each documented in two lines of the class docstring; the fields removed in 0.3
refused with what replaces them; bad values refused with a hint (the full list of bad values: test_errors.py)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from hf_triforce import TriForceConfig
from hf_triforce.config import REMOVED_FIELDS, TriForceConfigError, field_docs

pytestmark = pytest.mark.unit


def test_at_most_15_fields_each_documented_in_at_most_two_lines():
    names = [f.name for f in dataclasses.fields(TriForceConfig)]
    assert len(names) <= 15
    docs = field_docs()
    assert list(docs) == names  # in the fields' order, none missing, none extra
    args = inspect.getdoc(TriForceConfig).split("Args:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    starts = [i for i, line in enumerate(args) if not line.startswith("        ")]
    lines = [b - a for a, b in zip(starts, [*starts[1:], len(args)], strict=True)]
    assert max(lines) <= 2, dict(zip(names, lines, strict=True))


@pytest.mark.parametrize("name", sorted(REMOVED_FIELDS))
def test_a_removed_field_is_refused_saying_what_replaces_it(name):
    for make in (lambda: TriForceConfig(**{name: 1}), lambda: TriForceConfig.from_dict({name: 1})):
        with pytest.raises(TriForceConfigError, match=rf"TriForceConfig\({name}=...\) was removed in hf_triforce 0.3"):
            make()
    assert REMOVED_FIELDS[name] and name not in {f.name for f in dataclasses.fields(TriForceConfig)}


def test_an_unknown_field_is_a_config_error_not_a_type_error():
    with pytest.raises(TriForceConfigError, match=r"Unknown TriForceConfig fields \['budget'\]; valid fields are"):
        TriForceConfig(budget=512)  # no close name: the valid ones are listed


@pytest.mark.parametrize(
    "kwargs,guess",
    [
        (dict(retrival_budget=512), r"\['retrival_budget'\] \(did you mean retrieval_budget\?\)"),
        (dict(cuda_graph="auto"), r"\(did you mean cuda_graphs\?\)"),
        (dict(gama2=4, chunksize=8), r"\(did you mean chunksize -> chunk_size, gama2 -> gamma2\?\)"),
    ],
)
def test_a_misspelt_field_names_the_closest_one(kwargs, guess):
    for make in (lambda: TriForceConfig(**kwargs), lambda: TriForceConfig.from_dict(kwargs)):
        with pytest.raises(TriForceConfigError, match=guess):
            make()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(retrieval_budget="4096"),
            r"retrieval_budget must be 'auto' or an integer >= 8, got '4096' \(write 4096\)\.$",
        ),
        (dict(retrieval_budget="4k"), r"retrieval_budget must be 'auto' or an integer >= 8, got '4k'\.$"),
        (dict(gamma2="0"), r"gamma2 must be an integer >= 1, got '0'\.$"),  # no hint that is itself refused
        (dict(retrieval_budget=4096.0), r"got 4096.0 \(write 4096\)"),
        (dict(retrieval_budget=100), r"retrieval_budget=100 must be a multiple of chunk_size=8; try 96"),
        (dict(recent_window=12.0), r"recent_window=12.0 must be 'auto' or .*; try 'auto'"),
        (dict(level1_weights="int2"), r"level1_weights='int2' is not one of 'auto', 'full', 'int8', 'int4'"),
        (dict(cuda_graphs=1), r"cuda_graphs=1 is not one of True, False, 'auto', 'eager'"),
    ],
)
def test_bad_values_say_what_was_wrong(kwargs, message):
    with pytest.raises(TriForceConfigError, match=message):
        TriForceConfig(**kwargs)


def test_replace_keeps_validating():
    config = TriForceConfig()
    assert dataclasses.replace(config, gamma2=8).gamma2 == 8
    with pytest.raises(TriForceConfigError, match="gamma2"):
        dataclasses.replace(config, gamma2=0)


def test_auto_view_is_a_share_of_the_context_within_its_floor_and_ceiling():
    """``retrieval_budget='auto'`` (the default) resolves once per call: a sixteenth of the prompt in whole chunks,
    512 to 4096 tokens; an explicit integer wins; the resolved config is an ordinary one."""
    from hf_triforce.config import VIEW_CEILING, VIEW_FLOOR, VIEW_SHARE

    cfg = TriForceConfig()
    assert cfg.retrieval_budget == "auto" and TriForceConfig.from_dict(cfg.to_dict()) == cfg
    for context in (100, 7000, 9000, 20000, 65536, 131072, 10**6):
        budget = cfg.for_context(context).retrieval_budget
        assert VIEW_FLOOR <= budget <= VIEW_CEILING and budget % cfg.chunk_size == 0
        assert budget == min(VIEW_CEILING, max(VIEW_FLOOR, context // VIEW_SHARE // 8 * 8))
    assert TriForceConfig(retrieval_budget=1024).for_context(131072).retrieval_budget == 1024
    resolved = TriForceConfig(recent_window="auto").for_context(20000)
    assert resolved.recent_tokens == resolved.retrieval_budget // 4  # the recent window follows the resolved view
    with pytest.raises(TriForceConfigError, match="too small"):
        TriForceConfig(recent_window=1024)  # the auto view's floor (512) could not hold it
