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
        (dict(retrieval_budget="4096"), r"retrieval_budget must be an integer >= 8, got '4096' \(write 4096\)\.$"),
        (dict(retrieval_budget="4k"), r"retrieval_budget must be an integer >= 8, got '4k'\.$"),
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
