"""Copy tasks the selection policy was not tuned on: random passages at several depths of several haystacks.

Every task places a random :mod:`passage <hf_triforce.evaluation.drafts.passages>` (prose, numbers and
identifiers, code or a table row) at a token depth of a haystack (:mod:`~hf_triforce.evaluation.common.haystacks`),
asks for it with one of several wordings and starts the answer with its first words, so the correct
continuation copies the rest of it from the middle of the context (see
:func:`~hf_triforce.evaluation.drafts.needle.build_needle_prompt`).

Two splits share nothing but the generators: ``tune`` (haystacks ``reference`` and ``code``, wordings 0-1)
chooses the default policy; ``heldout`` (haystacks ``guide``, ``changelog`` and the second half of
``reference``, wordings 2-3, other random draws) reports it. Each (split, seed, kind, depth) gives the same
task on every run.

Example:
    >>> spec = copy_task_specs("heldout", kinds=("code",), depths=(0.5,), seed=0)[0]
    >>> spec.split, spec.kind, spec.depth, spec.haystack in SPLITS["heldout"].haystack_names
    ('heldout', 'code', 0.5, True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..common.documents import DocumentError
from ..common.haystacks import haystack_text
from .needle import NeedlePrompt, build_needle_prompt
from .passages import PASSAGE_KINDS, Passage, make_passage

WORDINGS = (
    "Somewhere in the document above there is a {label}. Copy that {label} exactly, word for word.",
    "Find the {label} hidden in the text above and write it out again verbatim.",
    "The text above contains a {label}. Repeat the {label} exactly as it is written there.",
    "Quote the {label} from the document above, keeping every character unchanged.",
)
"""Requests for the passage; ``{label}`` is the passage's name (e.g. "inventory record")."""


@dataclass(frozen=True)
class CopySplit:
    """Which haystacks (name, start fraction), wordings and cue lengths a split draws from."""

    name: str
    haystacks: tuple[tuple[str, float], ...]
    wordings: tuple[int, ...]
    cue_words: tuple[int, ...]

    @property
    def haystack_names(self) -> list[str]:
        return [f"{name}@{start:g}" for name, start in self.haystacks]


SPLITS = {
    "tune": CopySplit("tune", (("reference", 0.0), ("code", 0.0)), (0, 1), (6, 8)),
    "heldout": CopySplit("heldout", (("guide", 0.0), ("changelog", 0.0), ("reference", 0.5)), (2, 3), (5, 7)),
}
"""The two splits: ``tune`` chooses the default policy, ``heldout`` reports it."""


@dataclass(frozen=True)
class CopyTaskSpec:
    """One copy task before tokenization: where the passage goes and how it is asked for."""

    split: str
    kind: str
    depth: float
    haystack: str
    wording: int
    cue_words: int
    passage: Passage

    @property
    def name(self) -> str:
        return f"copy-{self.kind}@{self.depth:g}"


def copy_task_specs(
    split: str, kinds: tuple[str, ...] = PASSAGE_KINDS, depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9), seed=0
) -> list[CopyTaskSpec]:
    """One task per (kind, depth) of ``split``, each drawn from its own seeded generator.

    Raises:
        DocumentError: an unknown split.

    Example:
        >>> [s.name for s in copy_task_specs("tune", kinds=("prose", "table"), depths=(0.1,))]
        ['copy-prose@0.1', 'copy-table@0.1']
    """
    if split not in SPLITS:
        raise DocumentError(f"unknown copy-task split {split!r}: choose one of {sorted(SPLITS)}.")
    return [_spec(SPLITS[split], kind, depth, seed) for kind in kinds for depth in depths]


def _spec(split: CopySplit, kind: str, depth: float, seed: int) -> CopyTaskSpec:
    rng = random.Random(f"{seed}/{split.name}/{kind}/{depth:g}")
    haystack = rng.choice(split.haystack_names)
    wording, cue_words = rng.choice(split.wordings), rng.choice(split.cue_words)
    return CopyTaskSpec(split.name, kind, depth, haystack, wording, cue_words, make_passage(kind, rng))


def build_copy_prompt(tokenizer, spec: CopyTaskSpec, context_tokens: int, texts: dict[str, str]) -> NeedlePrompt:
    """The chat prompt of ``spec``: its passage at ``spec.depth`` of its haystack, at most ``context_tokens``.

    Args:
        tokenizer: a fast tokenizer with a chat template.
        spec: the task.
        context_tokens: the prompt's length limit.
        texts: a cache of haystack texts by ``name@start`` (filled on first use).

    Example:
        >>> p = build_copy_prompt(tok, copy_task_specs("tune")[0], 6016, {})  # doctest: +SKIP
        >>> p.input_ids.shape[1] <= 6016  # doctest: +SKIP
        True
    """
    if spec.haystack not in texts:
        name, _, start = spec.haystack.partition("@")
        texts[spec.haystack] = haystack_text(name, float(start))
    request = WORDINGS[spec.wording].format(label=spec.passage.label)
    return build_needle_prompt(
        tokenizer, texts[spec.haystack], context_tokens, spec.depth, spec.passage.text, request, spec.cue_words
    )
