"""The transformers boundary's per-version names (hf_triforce.hf.versions)."""

from __future__ import annotations

import pytest
import transformers
from packaging import version

from hf_triforce.hf import versions

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("release", "name"),
    [("5.17.0", "past_key_values"), ("5.23.0", "past_key_values"), ("5.24.0", "cache"), ("5.39.1", "cache")],
)
def test_cache_argument_name_per_release(release, name):
    assert versions.cache_argument(release) == name


def test_installed_release_name():
    renamed = version.parse(transformers.__version__) >= version.parse(versions.CACHE_RENAMED_IN)
    assert versions.CACHE_ARG == ("cache" if renamed else "past_key_values")
    assert versions.cache_kwargs("c") == {versions.CACHE_ARG: "c"}


def test_find_cache_looks_under_both_names():
    assert versions.find_cache({}) == (None, None)
    assert versions.find_cache({"past_key_values": "old"}) == ("past_key_values", "old")
    assert versions.find_cache({"cache": "new", "past_key_values": None}) == ("cache", "new")


@pytest.mark.parametrize("release", ["4.57.1", "6.0.0", "5.16.1"])
def test_unsupported_releases_are_refused(release):
    with pytest.raises(ImportError, match="transformers>=5.17,<6"):
        versions.check_transformers_version(release)
