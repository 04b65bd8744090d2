"""Copy tasks for the level-1 selection policy: passages, haystacks and the tune / held-out splits.

The held-out split must share nothing with the tune split but the generators (haystacks, wordings, random
draws), every (split, seed, kind, depth) must give the same task on every run, and each passage kind must
look like what it claims to be.
"""

from __future__ import annotations

import ast
import random

import pytest

from hf_triforce.evaluation.common.documents import DocumentError
from hf_triforce.evaluation.common.haystacks import HAYSTACKS, haystack_text, html_text
from hf_triforce.evaluation.drafts.copy_tasks import SPLITS, WORDINGS, copy_task_specs
from hf_triforce.evaluation.drafts.needle import passage_prefix
from hf_triforce.evaluation.drafts.passages import PASSAGE_KINDS, make_passage
from hf_triforce.evaluation.drafts.tasks import haystack_task

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


def test_splits_share_no_haystack_region_and_no_wording():
    tune, heldout = SPLITS["tune"], SPLITS["heldout"]
    assert not set(tune.haystack_names) & set(heldout.haystack_names)
    assert not set(tune.wordings) & set(heldout.wordings)
    assert set(tune.wordings) | set(heldout.wordings) == set(range(len(WORDINGS)))
    assert len({name for name, _ in tune.haystacks} | {name for name, _ in heldout.haystacks}) >= 3


def test_specs_are_seeded_and_cover_every_kind_and_depth():
    depths = (0.1, 0.5, 0.9)
    specs = copy_task_specs("heldout", depths=depths, seed=3)
    assert specs == copy_task_specs("heldout", depths=depths, seed=3), "same seed, same tasks"
    assert [(s.kind, s.depth) for s in specs] == [(k, d) for k in PASSAGE_KINDS for d in depths]
    assert all(s.haystack in SPLITS["heldout"].haystack_names for s in specs)
    assert all(s.wording in SPLITS["heldout"].wordings for s in specs)
    other_seed = copy_task_specs("heldout", depths=depths, seed=4)
    assert [s.passage.text for s in specs] != [s.passage.text for s in other_seed]
    tune = copy_task_specs("tune", depths=depths, seed=3)
    assert not {s.passage.text for s in specs} & {s.passage.text for s in tune}
    with pytest.raises(DocumentError, match="unknown copy-task split"):
        copy_task_specs("test")


@pytest.mark.parametrize("seed", range(5))
def test_passage_kinds_look_like_their_kind(seed):
    prose = make_passage("prose", random.Random(seed)).text
    assert prose.startswith("Registry entry of the ") and prose.endswith(".") and "\n" not in prose
    ids = make_passage("identifiers", random.Random(seed)).text
    assert sum(c.isdigit() for c in ids) >= 30 and "checksum 0x" in ids
    code = make_passage("code", random.Random(seed)).text
    ast.parse(code)  # valid Python
    assert code.startswith("def ") and code.count("\n") == 7
    table = make_passage("table", random.Random(seed)).text.splitlines()
    assert len(table) == 3 and all(line.startswith("|") and line.endswith("|") for line in table)
    assert table[0].count("|") == table[2].count("|"), "the row has a cell per column"
    for kind in PASSAGE_KINDS:
        haystack = haystack_text("reference")[:200_000]
        assert make_passage(kind, random.Random(seed)).text not in haystack


def test_unknown_passage_kind_is_refused():
    with pytest.raises(ValueError, match="unknown passage kind"):
        make_passage("poem", random.Random(0))


def test_passage_prefix_keeps_whitespace():
    assert passage_prefix("def f(x):\n    return x", 3) == "def f(x):\n    return"
    assert passage_prefix("a  b c", 2) == "a  b"
    assert passage_prefix("a b", 0) == "" and passage_prefix("a b", 9) == "a b"


def test_haystack_slices_start_mid_part_and_refuse_a_short_text():
    """Natural prompts of a haystack: slice i of n starts in the middle of part i of the possible starts, so never
    at either end (where the benchmarks' genre slices, used in tuning, start), and a short text is refused."""
    ids = list(range(1000))
    starts = [haystack_task(ids, "code", i, 4, 200).info["start_token"] for i in range(4)]
    assert starts == [100, 300, 500, 700]
    task = haystack_task(ids, "code", 3, 4, 200)
    assert task.name == "code#3" and task.prompt.tolist() == [ids[700:900]]
    with pytest.raises(DocumentError, match="fewer than a 2000-token prompt"):
        haystack_task(ids, "guide", 0, 1, 2000)
