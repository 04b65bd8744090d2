"""The suffix-automaton drafter against a brute-force search for the longest earlier match."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_triforce.hierarchy import Drafter
from hf_triforce.hierarchy.suffix import SuffixAutomaton, SuffixDrafter

pytestmark = pytest.mark.unit


def brute_force(indexed: list[int], tail: list[int]) -> tuple[int, int]:
    """Longest suffix of ``indexed + tail`` occurring in ``indexed`` followed by a token; its first end."""
    text, n = indexed + tail, len(indexed)
    for length in range(len(text), 0, -1):
        suffix = text[-length:]
        ends = [e for e in range(length - 1, n - 1) if indexed[e - length + 1 : e + 1] == suffix]
        if ends:
            return length, ends[0]
    return 0, -1


tokens = st.lists(st.integers(0, 3), max_size=40)


@settings(max_examples=400, deadline=None)
@given(indexed=tokens, tail=st.lists(st.integers(0, 3), max_size=6), split=st.integers(0, 40))
def test_longest_earlier_match_is_exact(indexed, tail, split):
    sam = SuffixAutomaton()
    sam.extend(indexed[:split])  # built in two pieces: the incremental path
    sam.extend(indexed[split:])
    assert sam.longest_earlier_match(tail) == brute_force(indexed, tail)


def test_states_stay_linear():
    sam = SuffixAutomaton()
    sam.extend(torch.randint(0, 50, (5000,), generator=torch.Generator().manual_seed(0)).tolist())
    assert len(sam.length) <= 2 * len(sam)


def test_drafter_proposes_the_continuation_of_the_match():
    drafter = SuffixDrafter(min_match=2)
    assert isinstance(drafter, Drafter)
    document = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    drafter.commit(document)
    assert drafter.propose(document, 4)[0].tolist() == [4, 5, 6]
    round_tail = torch.cat([document, torch.tensor([4, 5])])  # level-1 tokens of this round, not committed
    assert drafter.propose(round_tail, 2)[0].tolist() == [6, 7]
    assert drafter.propose(torch.cat([document, torch.tensor([0])]), 3)[0].numel() == 0  # no match of length 2


def test_draft_length_follows_the_match_length():
    drafter = SuffixDrafter(min_match=1)
    ids = torch.tensor([7, 1, 2, 3, 4, 5, 9, 3])
    drafter.commit(ids)
    assert drafter.propose(ids, 5)[0].tolist() == [4]  # a 1-token match drafts 1 token
    longer = torch.tensor([7, 1, 2, 3, 4, 5, 9, 1, 2, 3])
    drafter = SuffixDrafter()
    drafter.commit(longer)
    assert drafter.propose(longer, 5)[0].tolist() == [4, 5, 9]  # a 3-token match drafts 3


def test_commit_is_incremental():
    drafter = SuffixDrafter()
    ids = torch.arange(20) % 7
    drafter.commit(ids[:10])
    drafter.commit(ids)
    reference = SuffixAutomaton()
    reference.extend(ids.tolist())
    assert drafter.automaton.tokens == reference.tokens and drafter.automaton.length == reference.length
