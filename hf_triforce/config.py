"""``TriForceConfig``: every knob of the hierarchy, validated before any work is done."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from .errors import TriForceConfigError

DRAFTERS = ("auto", "model", "suffix", "ngram", "none")
LEVEL1_WEIGHTS = ("auto", "full", "int8", "int4")
LEVEL1_FORWARDS = ("auto", "direct", "transformers")
CUDA_GRAPH_MODES = (True, False, "auto", "eager")
REMOVED_IN = "0.3"
"""The release that removes the deprecated fields (``metadata["deprecated"]``: what replaces each)."""


@dataclass
class TriForceConfig:
    """Configuration of TriForce hierarchical speculative decoding.

    Level 0 (a tiny draft model with a StreamingLLM cache, or n-gram lookup, or nothing) proposes
    ``gamma1`` tokens at a time; level 1 (the target's weights over a ``retrieval_budget``-token
    sparse view of its KV cache) verifies them and yields ``gamma2`` tokens; level 2 (the target with
    its full cache) verifies those. Every level uses exact speculative sampling, so the output is
    exactly what plain ``generate()`` would produce (greedy) or distributed exactly like it (sampling).

    Ten fields are deprecated and removed in hf_triforce 0.3 (:meth:`deprecated_fields`; the tuning guide gives each
    one's measured reason): until then each still takes effect, and setting one to a value other than its default
    emits a ``FutureWarning`` that says what replaces it.

    Example:
        >>> cfg = TriForceConfig(retrieval_budget=512, chunk_size=8, gamma2=6)
        >>> TriForceConfig.from_dict(cfg.to_dict()) == cfg
        True
    """

    retrieval_budget: int = field(
        default=4096,
        metadata={
            "help": "Tokens of the full KV cache (per layer and KV head) in the level-1 sparse view: the "
            "attention-sink chunk, the top-scoring chunks and the recent window. Multiple of chunk_size."
        },
    )
    chunk_size: int = field(
        default=8, metadata={"help": "Tokens per retrieval chunk; each chunk is summarized by its mean post-RoPE key."}
    )
    recent_window: int | str = field(
        default="auto",
        metadata={
            "help": "Most recent tokens always kept in the sparse view (a multiple of chunk_size), or 'auto': a "
            "quarter of retrieval_budget, rounded down to whole chunks (recent_tokens gives the number). Running "
            "text is predicted from the tokens just before it, copied text from the chunks retrieval finds: a "
            "quarter was chosen among 64 tokens, an eighth, a quarter and a half of the budget on the tune split of "
            "the copy tasks and on natural continuations, and is reported on the held-out split "
            "(benchmarks/results/recent-window-*.md); 64 was the default before."
        },
    )
    lookahead_chunks: int = field(
        default=1,
        metadata={
            "help": "Deprecated (removed in 0.3): the selection always keeps one look-ahead chunk, the default. No "
            "recorded setting gains from another value: on the tune split of the copy tasks 1 lifted the worst depth "
            "from 0.919 (0, TriForce's plain top-k) to 0.950 at budget 1/8 and 2 and 3 were no better "
            "(benchmarks/results/eval-copy-tune.md); the held-out split confirmed it (eval-copy-heldout.md). Chunks "
            "after each top-scoring chunk that the selection also keeps (each chunk competes with the best score of "
            "itself and the lookahead_chunks chunks before it): a copy is read forward, so a round's drafts need the "
            "chunk after the one the query attends to now.",
            "deprecated": "the selection always keeps one look-ahead chunk (the default, 1)",
        },
    )
    rescore_candidates: int = field(
        default=4,
        metadata={
            "help": "N >= 1: the mean keys nominate N times as many chunks as the view has room for, and those are "
            "ranked by their keys themselves (the largest attention logit of the chunk over the GQA group's query "
            "heads), which reads N x the view's keys per re-selection. 0: chunks are ranked by query . mean key "
            "(TriForce). 4 (the default since 2026-11-28) meets issue 18's level-1 targets on the held-out copy "
            "tasks (worst depth 0.940 at budget 1/16 and 0.976 at 1/8, against 0.842 and 0.888 with 0; "
            "benchmarks/results/copy-selection-ceiling-heldout-auto.md) and stays above StreamingLLM on natural "
            "text. Its cost: a refresh 6.1 ms against 4.4 with 0, beside a 12.2 ms CUDA-graph level-1 step "
            "(Llama-3.1-8B shape at 128K on an H100, benchmarks/results/h100-rowsum-*.md); 44 against 21 ms at 7K "
            "on a 2-core CPU (level-1 step 60-64 ms). Set 0 for the cheapest refresh where answers do not copy "
            "from the context."
        },
    )
    step_selection: bool = field(
        default=False,
        metadata={
            "help": "Deprecated (removed in 0.3): leave it False. It buys level-1 acceptance, not speed, and the "
            "default selection (rescore_candidates=4) meets the held-out copy targets without it: decoding 20.6 and "
            "18.9 tokens/s against the defaults' 23.3 and 23.9 at budgets 1/16 and 1/8 on a 2-core CPU "
            "(benchmarks/results/step-selection-heldout.md); with the default n-gram level 0, -12 % and +12 % end to "
            "end (step-selection-heldout-e2e.md); on a GPU its re-ranking (13.9-16.4 ms per forward, "
            "h200-*-step-selection.json) needs the eager direct level-1 step instead of the CUDA-graph one. Inside "
            "every level-1 forward, each of the later half of the layers ranks chunks by their keys (the chunk's "
            "largest logit) with the query it has just computed, before it attends, and the view swaps in the chunks "
            "that changed (hf_triforce.caches.chunk_swap). The chunks it ranks are the 4 k that each refresh "
            "nominates by ranking every chunk with the queries of the tokens the last verification accepted. A "
            "selection made once per refresh with the newest token's query goes stale within a round. Held-out copy "
            "tasks, worst depth: 0.981 at budget 1/16 and 1/8 (defaults 0.872 and 0.907), at 15 ms of selection per "
            "19 ms level-1 forward on a 2-core CPU (slower decoding): benchmarks/results/step-selection-heldout.md "
            "(docs: Benchmark history, step_selection). True needs level 1's direct forward (one sequence, dynamic "
            "steps) and is refused elsewhere.",
            "deprecated": "leave it False: the default selection (rescore_candidates=4) meets the level-1 targets, "
            "and no recorded run decoded faster with it",
        },
    )
    level1_weights: str = field(
        default="auto",
        metadata={
            "help": "Weights level 1 drafts with. 'full': the target's own. 'int8': a weight-only int8 copy (one scale "
            "per output channel, bfloat16 activations), made at the first call and kept beside the model (a quarter "
            "of the float32 weight bytes); a CPU model in float32 or bfloat16 only. The full-cache verification "
            "still uses the target's own weights, so the output is unchanged; the copy makes a level-1 step cheaper "
            "(SmolLM2 on 2 CPU cores: 42 -> 26 ms) at a small cost in level-1 acceptance. 'int4': the decoder "
            "layers' projections as a weight-only int4 copy (groups of 32 inputs, bfloat16 scales and zeros), the LM "
            "head as int8 on the CPU; on a CUDA GPU of compute capability 8.0+ the same copy runs through "
            "torch._weight_int4pack_mm (tinygemm) and the LM head keeps its own weights ('int8' is CPU-only). "
            "'auto': 'int4' where level 1 runs its direct forward, else 'int8' where it runs, else 'full'; on CUDA "
            "'full' until a GPU run measures the int4 copy faster (benchmarks/gpu_run.sh, step 8b-int4)."
        },
    )
    level1_forward: str = field(
        default="auto",
        metadata={
            "help": "Deprecated (removed in 0.3): 'auto' decides this. Only A/B runs and step_selection's GPU "
            "baseline set another value; 'auto' already takes the faster one where both were measured "
            "(benchmarks/results/level1-forward-ab-7k.json: direct won 4 rounds of 6 and tied 2 on a 2-core CPU), and "
            "on a GPU the CUDA-graph step (cuda_graphs) is the fast path (12.5 ms against 36.8-40.1 ms for the eager "
            "direct step, h100-llama3.1-8b*.json). How level 1's forwards run. 'direct': plain torch calls over the "
            "model's weights (hf_triforce.hf.direct_forward; Llama, Mistral, Qwen2, Qwen3 and Phi-3 layouts; with the "
            "int8 copy, fused q|k|v and gate|up products), skipping transformers' per-module overhead (SmolLM2 on 2 "
            "CPU cores, int8: 29 -> 20 ms a step); the dynamic-shape path only (cuda_graphs=False or 'auto' off "
            "CUDA). 'transformers': the model's own forward. 'auto': 'direct' on the CPU where it runs, else "
            "'transformers'. Level 1 only drafts, so the output is unchanged either way.",
            "deprecated": "'auto' decides this (level 1's direct forward on the CPU where it runs, else transformers' "
            "forward); on a GPU set cuda_graphs",
        },
    )
    gamma1: int = field(
        default=2, metadata={"help": "Tokens drafted by level 0 per level-1 verification (the most, when adaptive)."}
    )
    gamma2: int = field(
        default=6,
        metadata={
            "help": "Tokens drafted by level 1 per full-cache verification (the most, when adaptive: a single "
            "sequence's round then stops earlier where level 1's confidence in its drafts says one more token does "
            "not pay, see hf_triforce.hierarchy.planner)."
        },
    )
    tree_budget: int | str = field(
        default="auto",
        metadata={
            "help": "Token trees (Sequoia) between level 1 and the full cache: level 1 drafts a tree, a node's "
            "children being its top candidates (greedy) or candidates drawn without replacement (sampling), and one "
            "full-cache forward verifies every node with a tree mask. 0: chains, one draft per position. N >= 2: a "
            "tree of at most N nodes (the root included), depth at most gamma2, shaped by Sequoia's dynamic program "
            "for the positional acceptance the call measures. 'auto' (the default): with adaptive=True, a tree where "
            "the call's measured forward costs say it yields more tokens per second than the chain, else the chain "
            "(on the CPU at long context a verification's cost grows with its width, so 'auto' keeps chains there: "
            "docs/trees.md). Trees need one unpadded sequence, full attention in every layer and level 1 on dynamic "
            "shapes; 'auto' uses chains elsewhere, and a node count is refused there."
        },
    )
    adaptive: bool = field(
        default=True,
        metadata={
            "help": "Choose each round's schedule and speculation lengths from the costs and acceptances measured "
            "during the call (hf_triforce.hierarchy.planner): level 0 -> 1 -> 2 with up to gamma1/gamma2 drafts, "
            "level 0 -> 2 directly, or a plain decoding step, whichever is expected to be fastest. False: always "
            "gamma1/gamma2 through all three levels. Lossless either way."
        },
    )
    confidence_stops: bool = field(
        default=True,
        metadata={
            "help": "Deprecated (removed in 0.3): adaptive decides this. No recorded setting is faster with False: "
            "2.02x against 2.05x plain generate() with it, over 12 sampled texts at 7K tokens "
            "(benchmarks/results/confidence-stops-ab-7k.json), T=0 equal within the noise. With adaptive, a single "
            "sequence's level-1 round drafts up to gamma2 tokens and stops where level 1's confidence in its drafts "
            "says one more token does not pay (hf_triforce.hierarchy.planner; SmolLM2 at 7K tokens, T=0.6, means over "
            "12 sampled texts: 2-9% more tokens per second, inside the text-to-text spread; T=0 unchanged). False: "
            "each round drafts the length planned at its start. Batches and tensor-parallel models always use the "
            "planned length. Lossless either way.",
            "deprecated": "adaptive decides this (a single sequence's level-1 round stops by level 1's confidence; "
            "adaptive=False drafts gamma2 every round)",
        },
    )
    draft_cache_budget: int = field(
        default=256, metadata={"help": "Tokens in the level-0 draft model's StreamingLLM cache (sinks + window)."}
    )
    draft_sinks: int = field(
        default=16,
        metadata={
            "help": "Deprecated (removed in 0.3): the draft cache keeps 16 sinks. No recorded run varied it "
            "(benchmarks/results/eval-copy-tune.md lists it as not measured; make tuning does not sweep it). "
            "Attention-sink tokens kept at the start of the level-0 draft model's StreamingLLM cache.",
            "deprecated": "the level-0 draft cache keeps 16 sink tokens within draft_cache_budget",
        },
    )
    refresh_every: int = field(
        default=4,
        metadata={
            "help": "Re-select the retrieval chunks after this many new tokens, checked at the start of each level-1 "
            "round (tokens since the last selection are always visible to level 1). 4, about every round, is the "
            "best measured trade-off (benchmarks/results/eval-drafts.md): a copy from the middle of a long prompt "
            "moves out of a stale selection within a few rounds, and a re-selection costs a fraction of a round."
        },
    )
    refresh_below_acceptance: float | None = field(
        default=None,
        metadata={
            "help": "Deprecated (removed in 0.3): use refresh_every. 0.5 and 0.8 added nothing on top of the default "
            "refresh_every=4 (benchmarks/results/eval-copy-tune.md); 1.0 with refresh_every=8 makes a third fewer "
            "refreshes but loses on natural text when sampling (refresh-on-rejection-natural12-4k.json), and no "
            "end-to-end run has measured it faster. Also re-select when a round's level-1 acceptance rate (accepted / "
            "drafted by level 1) falls below this value. None disables it. 1.0 re-selects after every round with a "
            "rejection: with refresh_every=8, a third fewer refreshes than the defaults at the same worst-depth "
            "acceptance on held-out copy tasks (T=0), a little lower on natural text when sampling "
            "(benchmarks/results/refresh-on-rejection.md).",
            "deprecated": "use refresh_every (a re-selection every refresh_every new tokens)",
        },
    )
    drafter: str = field(
        default="auto",
        metadata={
            "help": "Level-0 drafter: 'auto' (the assistant model when given, else n-gram lookup), 'model', "
            "'suffix' (the longest earlier match of the sequence's end, from a suffix automaton), 'ngram' (the latest "
            "earlier occurrence of the last ngram_max..ngram_min tokens) or 'none' (two levels: retrieval "
            "self-drafting verified by the full cache)."
        },
    )
    ngram_max: int = field(
        default=3,
        metadata={
            "help": "Deprecated (removed in 0.3): the n-gram drafter matches the last 3 down to 1 tokens; for longer "
            "matches use drafter='suffix'. No recorded run varied it (benchmarks/results/eval-copy-tune.md lists it "
            "as not measured; make tuning does not sweep it). Longest n-gram matched by the n-gram drafter.",
            "deprecated": "the n-gram drafter matches the last 3 down to 1 tokens; for longer matches use "
            "drafter='suffix'",
        },
    )
    ngram_min: int = field(
        default=1,
        metadata={
            "help": "Deprecated (removed in 0.3): the n-gram drafter matches down to 1 token; adaptive drops a "
            "drafter that does not pay. No recorded run varied it (benchmarks/results/eval-copy-tune.md lists it as "
            "not measured). Shortest n-gram matched by the n-gram drafter.",
            "deprecated": "the n-gram drafter matches down to 1 token, and adaptive drops level 0 where it does not "
            "pay",
        },
    )
    suffix_min_match: int = field(
        default=1,
        metadata={
            "help": "Deprecated (removed in 0.3): the suffix drafter drafts from any match; adaptive drops a drafter "
            "that does not pay. No recorded run varied it. Shortest match of the sequence's end that the suffix "
            "drafter drafts from.",
            "deprecated": "the suffix drafter drafts from any match, and adaptive drops level 0 where it does not pay",
        },
    )
    draft_acceptance_floor: float = field(
        default=0.15,
        metadata={
            "help": "Deprecated (removed in 0.3): adaptive decides whether level 0 drafts. 0, 0.15 and 0.5 gave "
            "speeds within the noise of each other in both recorded sweeps "
            "(benchmarks/results/cpu-smollm2-tuning.json and cpu-smollm2-tuning-defaults.json: 1.45x / 1.51x / "
            "1.40x). Pause level-0 drafting while its running acceptance rate (accepted / drafted, exponentially "
            "averaged) is below this value, probing again every 8 level-1 steps: a rejected draft still costs level 1 "
            "a wider forward. 0 always drafts.",
            "deprecated": "adaptive decides whether level 0 drafts (the gate keeps its 0.15 floor)",
        },
    )
    prefill_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Prefill the prompt in chunks of this many tokens (bounds activation memory for very long "
            "prompts). None: one forward, as plain generate() does, so the cache is bit-identical to its."
        },
    )
    cuda_graphs: bool | str = field(
        default=False,
        metadata={
            "help": "Run the level-1 (widths 1..gamma1+1) and level-0 (width 1) decoding steps on fixed-shape buffers "
            "replayed as CUDA graphs, and one sequence's full-cache verification (widths 1..gamma1+gamma2+1) over "
            "the full cache's fixed storage where every layer attends in full and the cache is not offloaded (not "
            "yet run on a GPU; elsewhere it verifies on dynamic shapes, just as exactly). 'auto': on when the model "
            "is on CUDA and supports it, else the dynamic-shape forwards; True: required (an error on a non-CUDA "
            "model); False: dynamic-shape forwards; 'eager': the fixed-shape steps without graphs on any device (the "
            "CPU reference of the graph path). Off by default: the level-0/1 graphs have run on H100/H200 GPUs with "
            "random weights only, so its end-to-end gain with real acceptance is modeled, not measured on a real "
            "checkpoint."
        },
    )
    offload_kv: bool = field(
        default=False,
        metadata={
            "help": "Keep the full KV cache in host memory (pinned on a machine with CUDA) instead of on the model's "
            "device: TriForce's offloading mode, for contexts whose cache does not fit the GPU. The weights, level 0, "
            "the retrieval view and the chunk means stay on the device, so level-0 and level-1 steps move no "
            "full-cache bytes; each full-cache forward (the prefill, each verification) streams every layer's keys "
            "and values to the device once, the next layer's while this one computes, and writes the new tokens' "
            "back. Set gamma2 to 12-16 with it (the paper's): a verification then costs a pass over the bus, and "
            "the planner drafts up to gamma2 tokens per pass. Lossless like every other setting "
            "(docs: Long context on a small GPU)."
        },
    )

    def __post_init__(self) -> None:
        self._check_positive("chunk_size", "gamma1", "gamma2", "refresh_every", "ngram_min", "suffix_min_match")
        self._check_budget()
        self._check_draft_cache()
        if self.level1_weights not in LEVEL1_WEIGHTS:
            raise TriForceConfigError(f"level1_weights={self.level1_weights!r} is not one of {LEVEL1_WEIGHTS}.")
        if self.level1_forward not in LEVEL1_FORWARDS:
            raise TriForceConfigError(f"level1_forward={self.level1_forward!r} is not one of {LEVEL1_FORWARDS}.")
        if self.drafter not in DRAFTERS:
            raise TriForceConfigError(f"drafter={self.drafter!r} is not one of {DRAFTERS}.")
        if self.ngram_max < self.ngram_min:
            raise TriForceConfigError(f"ngram_max ({self.ngram_max}) must be >= ngram_min ({self.ngram_min}).")
        if self.prefill_chunk_size is not None:
            self._check_positive("prefill_chunk_size")
        if not 0.0 <= self.draft_acceptance_floor <= 1.0:
            raise TriForceConfigError(f"draft_acceptance_floor={self.draft_acceptance_floor} must be in [0, 1].")
        if not isinstance(self.adaptive, bool):
            raise TriForceConfigError(f"adaptive must be True or False, got {self.adaptive!r}.")
        if not (isinstance(self.cuda_graphs, bool) or self.cuda_graphs in ("auto", "eager")):
            raise TriForceConfigError(f"cuda_graphs={self.cuda_graphs!r} must be one of {CUDA_GRAPH_MODES}.")
        if not isinstance(self.rescore_candidates, int) or self.rescore_candidates < 0:
            raise TriForceConfigError(f"rescore_candidates must be an integer >= 0, got {self.rescore_candidates!r}.")
        if not isinstance(self.offload_kv, bool):
            raise TriForceConfigError(f"offload_kv must be True or False, got {self.offload_kv!r}.")
        if self.offload_kv and self.step_selection is True:
            raise TriForceConfigError(
                "offload_kv=True keeps the full cache in host memory, and step_selection=True copies chunks from it "
                "inside every level-1 forward: use step_selection=False."
            )
        if not isinstance(self.step_selection, bool):
            raise TriForceConfigError(f"step_selection must be True or False, got {self.step_selection!r}.")
        if not isinstance(self.lookahead_chunks, int) or self.lookahead_chunks < 0:
            raise TriForceConfigError(f"lookahead_chunks must be an integer >= 0, got {self.lookahead_chunks!r}.")
        if self.level1_forward == "direct" and self.cuda_graphs in (True, "eager"):
            raise TriForceConfigError(
                f"level1_forward='direct' runs level 1 on the dynamic-shape path, and cuda_graphs={self.cuda_graphs!r} "
                "runs it on static buffers: use cuda_graphs=False, or level1_forward='auto'."
            )
        self._check_tree_budget()
        r = self.refresh_below_acceptance
        if r is not None and not 0.0 <= r <= 1.0:
            raise TriForceConfigError(f"refresh_below_acceptance={r} must be None or in [0, 1].")
        self._warn_deprecated()

    def _warn_deprecated(self) -> None:
        """One ``FutureWarning`` per deprecated field (``metadata["deprecated"]``) set to a value other than its
        default; the field still takes effect until it is removed (:data:`REMOVED_IN`)."""
        for f in fields(self):
            instead = f.metadata.get("deprecated")
            if instead is None or f.default is MISSING:
                continue
            value = getattr(self, f.name)
            if value == f.default:
                continue
            warnings.warn(
                f"{f.name}={value!r}: TriForceConfig.{f.name} is deprecated and is removed in hf_triforce "
                f"{REMOVED_IN}; {instead}. It still takes effect until then.",
                FutureWarning,
                stacklevel=_caller_stacklevel(),
            )

    @classmethod
    def deprecated_fields(cls) -> dict[str, str]:
        """``{field: what replaces it}`` for the fields removed in hf_triforce 0.3 (setting one to a value other than
        its default warns, and still takes effect until then).

        Example:
            >>> "step_selection" in TriForceConfig.deprecated_fields(), "gamma2" in TriForceConfig.deprecated_fields()
            (True, False)
        """
        return {f.name: f.metadata["deprecated"] for f in fields(cls) if "deprecated" in f.metadata}

    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TriForceConfigError(f"{name} must be an integer >= 1, got {value!r}.")

    def _check_tree_budget(self) -> None:
        t = self.tree_budget
        if t == "auto" or (isinstance(t, int) and not isinstance(t, bool) and (t == 0 or t >= 2)):
            return
        raise TriForceConfigError(
            f"tree_budget={t!r} must be 'auto', 0 (chains) or a node count >= 2 (the root included)."
        )

    def _check_budget(self) -> None:
        c, b, w = self.chunk_size, self.retrieval_budget, self.recent_window
        if w != "auto" and (not isinstance(w, int) or isinstance(w, bool) or w < 0 or w % c):
            hint = max(c, w // c * c) if isinstance(w, int) else "'auto'"
            raise TriForceConfigError(
                f"recent_window={w!r} must be 'auto' or a non-negative multiple of chunk_size={c}; try {hint}."
            )
        if not isinstance(b, int) or b % c:
            raise TriForceConfigError(
                f"retrieval_budget={b!r} must be a multiple of chunk_size={c}; try {max(c, (b or 0) // c * c)}."
            )
        w = self.recent_tokens
        minimum = self.min_retrieval_budget
        if b < minimum:
            raise TriForceConfigError(
                f"retrieval_budget={b} is too small: it must hold the sink chunk, the recent window and at least "
                f"one retrieved chunk ({c} + {w} + {c} = {minimum} tokens). Raise it or lower recent_window."
            )

    def _check_draft_cache(self) -> None:
        self._check_positive("draft_cache_budget")
        if not isinstance(self.draft_sinks, int) or self.draft_sinks < 0:
            raise TriForceConfigError(f"draft_sinks must be an integer >= 0, got {self.draft_sinks!r}.")
        needed = self.draft_sinks + self.gamma1 + 1
        if self.draft_cache_budget < needed:
            raise TriForceConfigError(
                f"draft_cache_budget={self.draft_cache_budget} is too small for draft_sinks={self.draft_sinks} and "
                f"gamma1={self.gamma1}: it needs at least draft_sinks + gamma1 + 1 = {needed} tokens."
            )

    @property
    def recent_tokens(self) -> int:
        """The recent window in tokens: ``recent_window``, or for ``'auto'`` a quarter of ``retrieval_budget``
        rounded down to whole chunks.

        Example:
            >>> TriForceConfig(retrieval_budget=512).recent_tokens, TriForceConfig(recent_window=64).recent_tokens
            (128, 64)
        """
        if self.recent_window != "auto":
            return self.recent_window
        return self.retrieval_budget // 4 // self.chunk_size * self.chunk_size

    @property
    def min_retrieval_budget(self) -> int:
        """Smallest valid ``retrieval_budget``: sink chunk + recent window + one retrieved chunk."""
        return 2 * self.chunk_size + self.recent_tokens

    def full_cache_capacity(self, max_length: int) -> int:
        """Slots per layer the full cache reserves for a call of ``max_length`` tokens.

        A verification forward appends the ``gamma2`` level-1 drafts and the token before them past the sequence
        (``max_length - 1`` tokens cached at most) before the rejected ones are cropped: ``max_length + gamma2 + 2``,
        rounded up to whole chunks (the storage holds whole chunks, so chunks copy as rows of a chunk each).

        Example:
            >>> TriForceConfig(gamma2=6, chunk_size=8).full_cache_capacity(1001)
            1016
        """
        return self.whole_chunks(max_length + self.gamma2 + 2)

    def whole_chunks(self, slots: int) -> int:
        """``slots`` rounded up to a multiple of ``chunk_size``: what a cache or view storage holds for them (its
        slots hold whole chunks, so a chunk copies as one row).

        Example:
            >>> TriForceConfig(chunk_size=8).whole_chunks(777)
            784
        """
        return slots + -slots % self.chunk_size

    @property
    def view_extra_capacity(self) -> int:
        """Slots a level-1 view holds beyond its selection: the full cache's tokens appended until the next
        re-selection (``refresh_every``), one round of level-1 (``gamma2``) and level-0 (``gamma1``) drafts, and 2.
        """
        return self.refresh_every + self.gamma2 + self.gamma1 + 2

    @property
    def view_capacity(self) -> int:
        """Slots per layer of the fixed-capacity (static) level-1 view: ``retrieval_budget + view_extra_capacity``."""
        return self.retrieval_budget + self.view_extra_capacity

    @property
    def draft_evict_batch(self) -> int:
        """Window tokens the level-0 StreamingLLM cache evicts at once beyond what a forward needs (amortizes the
        re-rotation of the keys that move down), leaving room for a ``gamma1``-token step: at most 16."""
        return min(16, (self.draft_cache_budget - self.draft_sinks - self.gamma1 - 1) // 2)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict that ``from_dict`` turns back into an equal config."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriForceConfig:
        """Build a config from ``to_dict()`` output; unknown keys raise ``TriForceConfigError``. A deprecated field
        at a value other than its default warns, as in the constructor."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TriForceConfigError(f"Unknown TriForceConfig keys {unknown}; valid keys are {sorted(known)}.")
        return cls(**data)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside hf_triforce and the dataclass machinery (the generated
    ``__init__``, ``dataclasses.replace``): the user's line that set the deprecated field."""
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn is level 1
    while frame is not None:
        name = frame.f_code.co_filename
        inside = name.startswith(_PACKAGE_DIR) or name == "<string>" or name.endswith(f"{os.sep}dataclasses.py")
        if not inside:
            return level
        frame, level = frame.f_back, level + 1
    return 1
