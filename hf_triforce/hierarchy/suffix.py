"""Suffix-automaton drafting (Blumer et al. 1985; as in SuffixDecoding, Oliaro et al. 2024): continue the sequence with
what followed the longest earlier match of its end, more tokens for a longer match. Deterministic: a one-hot ``q``."""

from __future__ import annotations

import torch


class SuffixAutomaton:
    """The suffix automaton of a growing token sequence, with the end of each state's first occurrence."""

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.first_end = [-1]
        self.last = 0
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the indexed sequence."""
        for token in tokens:
            self.tokens.append(token)
            cur = self._new_state(self.length[self.last] + 1, len(self.tokens) - 1)
            state = self.last
            while state != -1 and token not in self.next[state]:
                self.next[state][token] = cur
                state = self.link[state]
            self.link[cur] = 0 if state == -1 else self._split(state, token)
            self.last = cur

    def _split(self, state: int, token: int) -> int:
        """The state the new state links to, cloning ``next[state][token]`` when it is not solid."""
        target = self.next[state][token]
        if self.length[state] + 1 == self.length[target]:
            return target
        clone = self._new_state(self.length[state] + 1, self.first_end[target])
        self.next[clone] = dict(self.next[target])
        self.link[clone] = self.link[target]
        while state != -1 and self.next[state].get(token) == target:
            self.next[state][token] = clone
            state = self.link[state]
        self.link[target] = clone
        return clone

    def _new_state(self, length: int, first_end: int) -> int:
        self.next.append({})
        self.link.append(-1)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def longest_earlier_match(self, tail: list[int]) -> tuple[int, int]:
        """``(length, end)`` of the longest suffix of ``indexed + tail`` that occurs in the indexed sequence followed by
        a token: ``tokens[end + 1]`` followed its first occurrence; ``(0, -1)`` when no suffix matches."""
        state, matched = self.last, len(self.tokens)
        for token in tail:
            while state and token not in self.next[state]:
                state = self.link[state]
                matched = self.length[state]
            if token in self.next[state]:
                state, matched = self.next[state][token], matched + 1
        while state and self.first_end[state] + 1 >= len(self.tokens):  # only the final occurrence: nothing follows
            state = self.link[state]
            matched = self.length[state]
        matched = min(matched, self.length[state])
        return (matched, self.first_end[state]) if state else (0, -1)


class SuffixDrafter:
    """Level-0 :class:`~hf_triforce.hierarchy.drafter.Drafter` over a suffix automaton of the committed sequence.

    Proposes ``min(k, match length)`` tokens, none when the match is shorter than ``min_match``. The automaton indexes
    the committed tokens (:meth:`commit`); the round's uncommitted level-1 tokens are matched on top of it."""

    def __init__(self, min_match: int = 1) -> None:
        self.min_match = min_match
        self.automaton = SuffixAutomaton()

    def commit(self, sequence: torch.Tensor) -> None:
        """Index the committed ``[n]`` sequence's tokens not indexed yet (it only grows between calls)."""
        indexed = len(self.automaton)
        if sequence.shape[0] > indexed:
            self.automaton.extend(sequence[indexed:].tolist())

    def propose(self, prefix: torch.Tensor, k: int) -> tuple[torch.Tensor, None]:
        """Up to ``k`` draft tokens ``[<=k]`` continuing ``prefix`` (``[n]``: committed tokens, then this round's)."""
        if len(self.automaton) == 0:
            self.commit(prefix)
        tail = prefix[len(self.automaton) :].tolist()
        matched, end = self.automaton.longest_earlier_match(tail)
        if matched < self.min_match:
            return prefix[:0], None
        return prefix.new_tensor(self.automaton.tokens[end + 1 : end + 1 + min(k, matched)]), None
