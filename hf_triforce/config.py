"""``TriForceConfig``: every knob of the hierarchy, validated before any work is done."""

from __future__ import annotations

import difflib
import functools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .errors import TriForceConfigError

DRAFTERS = ("auto", "model", "ngram", "none")
LEVEL1_WEIGHTS = ("auto", "full", "int8", "int4")
CUDA_GRAPH_MODES = (True, False, "auto", "eager")
DRAFT_SINKS = 16
"""Attention-sink tokens the level-0 draft model's StreamingLLM cache keeps, within ``draft_cache_budget``."""
REMOVED_FIELDS = {
    "lookahead_chunks": "the selection always keeps one look-ahead chunk",
    "step_selection": "the default selection (rescore_candidates=4) meets the level-1 targets without it",
    "level1_forward": "the call picks level 1's forward (the direct forward on the CPU where it runs); on a GPU set "
    "cuda_graphs",
    "confidence_stops": "adaptive=True stops a round by level 1's confidence, adaptive=False drafts gamma2 tokens",
    "draft_sinks": f"the draft cache keeps {DRAFT_SINKS} sink tokens within draft_cache_budget",
    "refresh_below_acceptance": "use refresh_every",
    "ngram_max": "the n-gram drafter matches the last 3 down to 1 tokens",
    "ngram_min": "the n-gram drafter matches the last 3 down to 1 tokens",
    "suffix_min_match": "the suffix drafter is gone: use drafter='ngram'",
    "draft_acceptance_floor": "adaptive=True decides when level 0 drafts, adaptive=False always drafts gamma1 tokens",
}
"""Fields of hf_triforce 0.2 removed in 0.3, and what replaces each (the release notes)."""
VIEW_SHARE = 16
"""``retrieval_budget='auto'``: level 1's view holds this fraction (1/16) of the context, in whole chunks, within
:data:`VIEW_FLOOR` and :data:`VIEW_CEILING` (the measurements behind the three: the tuning guide)."""
VIEW_FLOOR = 512
"""The smallest ``'auto'`` view: below it a level-1 step costs about the same (its fixed part and the weights
dominate) and accepts fewer tokens."""
VIEW_CEILING = 4096
"""The largest ``'auto'`` view (TriForce's budget at 128K: a level-1 step's KV then reads about what its weights do on
an 8B GQA model)."""
REMOVED_CHOICES = {("drafter", "suffix"): "n-gram lookup (drafter='ngram', what 'auto' runs without a draft model)"}
"""Values of 0.2 removed in 0.3 (no record shows the suffix drafter faster than n-gram), and what replaces each."""


@dataclass
class TriForceConfig:
    """Configuration of TriForce hierarchical speculative decoding.

    Level 0 (a draft model, n-gram lookup, or nothing) proposes ``gamma1`` tokens at a time; level 1 (the
    target over a ``retrieval_budget``-token view of its KV cache) verifies them and drafts ``gamma2`` tokens; level 2
    (the target with its full cache) verifies those, exactly (what runs where: the documentation's What runs
    together page).

    Args:
        retrieval_budget: tokens of the full cache (per layer and KV head) in level 1's view (sink, best chunks, recent
            window): ``"auto"`` (a sixteenth of the prompt, 512 to 4096) or a multiple of ``chunk_size``.
        chunk_size: tokens per retrieval chunk; a chunk is scored by the mean of its keys.
        recent_window: the most recent tokens always in the view (a multiple of ``chunk_size``), or ``"auto"``: a
            quarter of ``retrieval_budget``.
        rescore_candidates: ``N >= 1``: the mean keys nominate ``N`` x the chunks the view holds and the chunks' own
            keys rank them; ``0``: rank by the mean keys alone (TriForce's rule, the cheapest refresh).
        level1_weights: weights level 1 drafts with: ``"full"`` (the target's), ``"int8"``/``"int4"`` (a weight-only
            copy made once; the verification keeps the target's weights), or ``"auto"``.
        gamma1: tokens level 0 drafts per level-1 step (the most, with ``adaptive``).
        gamma2: tokens level 1 drafts per full-cache verification (the most, with ``adaptive``).
        tree_budget: ``0``: chains; ``N >= 2``: level 1 drafts a token tree of at most ``N`` nodes verified in one
            forward (Sequoia); ``"auto"``: a tree where the call measures it faster than the chain.
        adaptive: choose each round's schedule and lengths from the costs and acceptances the call measures (a plain
            step where speculation would lose); ``False``: always ``gamma1``/``gamma2`` through all three levels.
        draft_cache_budget: tokens in the level-0 draft model's StreamingLLM cache (sinks and recent window).
        refresh_every: re-select level 1's chunks after this many new tokens (checked at each round's start).
        drafter: level 0: ``"auto"`` (the ``assistant_model`` when given, else n-gram lookup), ``"model"``,
            ``"ngram"`` or ``"none"`` (two levels).
        prefill_chunk_size: prefill the prompt in chunks of this many tokens (bounds activation memory); ``None``:
            one forward, as plain ``generate()`` does.
        cuda_graphs: ``"auto"``: CUDA graphs where the model is on CUDA and nothing blocks them, else (a CPU) dynamic
            shapes; ``True``: graphs, required; ``"eager"``: their fixed shapes without graphs; ``False``: dynamic.
        offload_kv: keep the full KV cache in host memory and stream it to the device for each verification (long
            contexts on a small GPU; set ``gamma2`` to 12-16 with it).

    Raises:
        TriForceConfigError: a value is invalid, or a field removed in 0.3 is set (the message says what replaces it).

    Example:
        >>> cfg = TriForceConfig(retrieval_budget=512, chunk_size=8, gamma2=6)
        >>> TriForceConfig.from_dict(cfg.to_dict()) == cfg
        True
    """

    retrieval_budget: int | str = "auto"
    chunk_size: int = 8
    recent_window: int | str = "auto"
    rescore_candidates: int = 4
    level1_weights: str = "auto"
    gamma1: int = 2
    gamma2: int = 6
    tree_budget: int | str = "auto"
    adaptive: bool = True
    draft_cache_budget: int = 256
    refresh_every: int = 4
    drafter: str = "auto"
    prefill_chunk_size: int | None = None
    cuda_graphs: bool | str = "auto"
    offload_kv: bool = False

    def __post_init__(self) -> None:
        for name in ("chunk_size", "gamma1", "gamma2", "refresh_every", "draft_cache_budget"):
            _check_int(name, getattr(self, name), 1)
        if self.retrieval_budget != "auto":
            _check_int("retrieval_budget", self.retrieval_budget, self.chunk_size, auto=True)
        _check_int("rescore_candidates", self.rescore_candidates, 0)
        if self.prefill_chunk_size is not None:
            _check_int("prefill_chunk_size", self.prefill_chunk_size, 1)
        _check_choice("level1_weights", self.level1_weights, LEVEL1_WEIGHTS)
        _check_choice("drafter", self.drafter, DRAFTERS)
        _check_choice("cuda_graphs", self.cuda_graphs, CUDA_GRAPH_MODES)
        for name in ("adaptive", "offload_kv"):
            if not isinstance(getattr(self, name), bool):
                raise TriForceConfigError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        t, c, b, w = self.tree_budget, self.chunk_size, self.retrieval_budget, self.recent_window
        if not (t == "auto" or (isinstance(t, int) and not isinstance(t, bool) and (t == 0 or t >= 2))):
            raise TriForceConfigError(
                f"tree_budget={t!r} must be 'auto', 0 (chains) or a node count >= 2 (the root included)."
            )
        if w != "auto" and (not isinstance(w, int) or isinstance(w, bool) or w < 0 or w % c):
            hint = f"try {max(c, w // c * c)}" if isinstance(w, int) and not isinstance(w, bool) else "try 'auto'"
            raise TriForceConfigError(
                f"recent_window={w!r} must be 'auto' or a non-negative multiple of chunk_size={c}; {hint}."
            )
        if b != "auto" and b % c:
            raise TriForceConfigError(f"retrieval_budget={b} must be a multiple of chunk_size={c}; try {b // c * c}.")
        smallest = VIEW_FLOOR if b == "auto" else b  # 'auto' never selects fewer
        if smallest < self.min_retrieval_budget:
            raise TriForceConfigError(
                f"retrieval_budget={b} is too small: it must hold the sink chunk, the recent window and at least one "
                f"retrieved chunk ({c} + {self.recent_tokens} + {c} = {self.min_retrieval_budget} tokens). Raise it "
                "or lower recent_window."
            )
        needed = DRAFT_SINKS + self.gamma1 + 1
        if self.draft_cache_budget < needed:
            raise TriForceConfigError(
                f"draft_cache_budget={self.draft_cache_budget} is too small for gamma1={self.gamma1}: the draft cache "
                f"holds {DRAFT_SINKS} sink tokens and a step's gamma1 + 1, so it needs at least {needed} tokens."
            )

    def for_context(self, context: int) -> TriForceConfig:
        """This config for a call over ``context`` prompt tokens: ``retrieval_budget='auto'`` resolved to a sixteenth
        of the context in whole chunks, at least :data:`VIEW_FLOOR` and at most :data:`VIEW_CEILING` tokens (an
        integer budget is kept). Decided once per call, before any work.

        Example:
            >>> [TriForceConfig().for_context(n).retrieval_budget for n in (2000, 7000, 32768, 131072)]
            [512, 512, 2048, 4096]
            >>> TriForceConfig(retrieval_budget=1024).for_context(7000).retrieval_budget
            1024
        """
        if self.retrieval_budget != "auto":
            return self
        share = context // VIEW_SHARE // self.chunk_size * self.chunk_size
        return replace(self, retrieval_budget=min(VIEW_CEILING, max(VIEW_FLOOR, share)))

    @property
    def recent_tokens(self) -> int:
        """The recent window in tokens: ``recent_window``, or for ``'auto'`` a quarter of ``retrieval_budget`` in
        whole chunks (of :data:`VIEW_FLOOR` while the budget is ``'auto'``).

        Example:
            >>> TriForceConfig(retrieval_budget=512).recent_tokens, TriForceConfig(recent_window=64).recent_tokens
            (128, 64)
        """
        if self.recent_window != "auto":
            return self.recent_window
        budget = VIEW_FLOOR if self.retrieval_budget == "auto" else self.retrieval_budget
        return budget // 4 // self.chunk_size * self.chunk_size

    @property
    def min_retrieval_budget(self) -> int:
        """Smallest valid ``retrieval_budget``: sink chunk + recent window + one retrieved chunk."""
        return 2 * self.chunk_size + self.recent_tokens

    def full_cache_capacity(self, max_length: int) -> int:
        """Slots per layer the full cache reserves for a call of ``max_length`` tokens: a verification appends
        ``gamma2`` drafts and the token before them to at most ``max_length - 1`` cached tokens, in whole chunks (a
        token tree wider than the room left is drafted as a chain: :meth:`Planner.plan_round`).

        Example:
            >>> TriForceConfig().full_cache_capacity(1000)
            1008
        """
        return self.whole_chunks(max_length + self.gamma2 + 2)

    def whole_chunks(self, slots: int) -> int:
        """``slots`` rounded up to a multiple of ``chunk_size`` (storage holds whole chunks).

        Example:
            >>> TriForceConfig(chunk_size=8).whole_chunks(777)
            784
        """
        return slots + -slots % self.chunk_size

    @property
    def view_extra_capacity(self) -> int:
        """Slots a level-1 view holds beyond its selection: the tokens added until the next re-selection, one round
        of level-1 and level-0 drafts, and 2."""
        return self.refresh_every + self.gamma2 + self.gamma1 + 2

    @property
    def view_capacity(self) -> int:
        """Slots per layer of the fixed-capacity level-1 view: ``retrieval_budget + view_extra_capacity``."""
        return self.retrieval_budget + self.view_extra_capacity

    @property
    def draft_evict_batch(self) -> int:
        """Window tokens the level-0 StreamingLLM cache evicts at once beyond what a step needs (amortizes the
        re-rotation of the keys that move), at most 16."""
        return min(16, (self.draft_cache_budget - DRAFT_SINKS - self.gamma1 - 1) // 2)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict that ``from_dict`` turns back into an equal config."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriForceConfig:
        """Build a config from ``to_dict()`` output; a removed or unknown key raises ``TriForceConfigError``.

        Example:
            >>> TriForceConfig.from_dict({"gamma2": 8}).gamma2
            8
        """
        return cls(**data)


def field_docs() -> dict[str, str]:
    """``{field: its help}`` from :class:`TriForceConfig`'s docstring ``Args`` (what ``help()`` shows, and the docs'
    table of fields)."""
    args = TriForceConfig.__doc__.split("    Args:\n", 1)[1].split("\n\n", 1)[0]
    docs: dict[str, str] = {}
    for line in args.splitlines():
        if line.startswith("        ") and not line.startswith("            "):
            name, text = line.strip().split(": ", 1)
            docs[name] = text
        else:
            docs[name] += " " + line.strip()
    return docs


def as_config(config: TriForceConfig | dict[str, Any]) -> TriForceConfig:
    """A :class:`TriForceConfig` from a config or its ``to_dict()``; anything else raises ``TriForceConfigError``.

    Example:
        >>> as_config({"gamma2": 4}).gamma2
        4
    """
    if isinstance(config, TriForceConfig):
        return config
    if isinstance(config, dict):
        return TriForceConfig.from_dict(config)
    raise TriForceConfigError(f"triforce_config must be a TriForceConfig or a dict, got {type(config).__name__}.")


def _check_int(name: str, value: Any, minimum: int, auto: bool = False) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return
    spelt = _as_int(value)
    hint = f" (write {spelt})" if spelt is not None and spelt >= minimum else ""
    choices = "'auto' or an integer" if auto else "an integer"
    raise TriForceConfigError(f"{name} must be {choices} >= {minimum}, got {value!r}{hint}.")


def _as_int(value: Any) -> int | None:
    """The integer a float or a string spells (``4096.0``, ``"4096"``), for the "write 4096" hint; else None.

    Example:
        >>> _as_int(4096.0), _as_int("4096"), _as_int(" 512 "), _as_int("4k"), _as_int(True)
        (4096, 4096, 512, None, None)
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    return None


def unknown_fields_message(unknown: list[str], known: set[str]) -> str:
    """The error for unknown ``TriForceConfig`` keywords, with the closest valid name of each misspelt one.

    Example:
        >>> unknown_fields_message(["retrival_budget"], {"retrieval_budget", "gamma2"})  # doctest: +ELLIPSIS
        "Unknown TriForceConfig fields ['retrival_budget'] (did you mean retrieval_budget?); valid fields are ..."
    """
    closest = {name: close[0] for name in unknown if (close := difflib.get_close_matches(name, known, 1, 0.75))}
    guesses = [f"{name} -> {guess}" for name, guess in closest.items()]
    if len(unknown) == 1 and closest:
        guesses = list(closest.values())
    did_you_mean = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return f"Unknown TriForceConfig fields {unknown}{did_you_mean}; valid fields are {sorted(known)}."


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if (name, value) in REMOVED_CHOICES:
        instead = REMOVED_CHOICES[name, value]
        raise TriForceConfigError(f"{name}={value!r} was removed in hf_triforce 0.3: use {instead}.")
    if not any(value == c and type(value) is type(c) for c in choices):
        raise TriForceConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}.")


def _refusing_removed_fields(init):
    """The dataclass ``__init__``, refusing a field removed in 0.3 (saying what replaces it) or an unknown keyword
    with :class:`TriForceConfigError` (not Python's ``TypeError``) before anything is built."""

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        known = {f.name for f in fields(TriForceConfig)}
        for name in kwargs:
            if name in REMOVED_FIELDS:
                raise TriForceConfigError(
                    f"TriForceConfig({name}=...) was removed in hf_triforce 0.3: {REMOVED_FIELDS[name]}. Drop {name}."
                )
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TriForceConfigError(unknown_fields_message(unknown, known))
        init(self, *args, **kwargs)

    return checked


TriForceConfig.__init__ = _refusing_removed_fields(TriForceConfig.__init__)
