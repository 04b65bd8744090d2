"""The offline long texts of other genres (haystacks) behind the bench's prompt set and its batch rows."""

from __future__ import annotations

import pytest

from hf_triforce.bench.documents import DocumentError
from hf_triforce.bench.haystacks import HAYSTACKS, haystack_text, html_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(HAYSTACKS))
def test_every_haystack_is_long_offline_text(name):
    text = haystack_text(name)
    assert len(text) > 30_000, "a haystack must hold a ~6K-token context"
    assert "<p>" not in text and "<div" not in text, "markup is removed"


def test_haystack_start_moves_to_a_line_and_bad_names_are_refused():
    full, second_half = haystack_text("reference"), haystack_text("reference", 0.5)
    assert full.endswith(second_half) and len(second_half) < 0.51 * len(full)
    assert full[len(full) - len(second_half) - 1] == "\n"
    with pytest.raises(DocumentError, match="unknown haystack"):
        haystack_text("novel")
    with pytest.raises(DocumentError, match="outside"):
        haystack_text("code", 1.0)


def test_html_text_drops_tags_scripts_and_styles():
    page = "<html><style>p {color: red}</style><p>Open <b>File</b></p>\n\n\n<script>x()</script><p>Close</p></html>"
    assert html_text(page) == "Open File\n\nClose"
