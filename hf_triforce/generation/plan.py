"""One plan per call: what each level runs and where the full cache lives, decided once, before any forward.

Everything a TriForce call can or cannot do is one table, :data:`LIMITS`: a feature, a condition that blocks it,
the error a request for it then raises and what to do instead. :func:`plan_call` reads it once per call into a frozen
:class:`CallPlan` (an ``"auto"`` option takes the fastest form nothing blocks, :data:`FALLBACKS`); nothing downstream
decides again. The docs' compatibility page is generated from the same table (:func:`compatibility_markdown`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..config import TriForceConfig
from ..errors import TriForceConfigError as Config
from ..errors import TriForceError
from ..errors import UnsupportedDeviceError as Device
from ..errors import UnsupportedGenerationError as Generation
from ..errors import UnsupportedModelError as Model
from ..hf.caches import callers_cache
from ..hf.distributed import RankConsensus, random_states_differ
from ..hf.facts import ModelFacts, model_facts
from ..hf.generate import effective_cache_implementation
from ..hf.masks import has_mask_function
from ..hf.model import TESTED_MODEL_TYPES, context_limit, vocab_size
from ..hierarchy.static_steps import StepMode
from .offload_fit import offload_fit_problem
from .reuse import callers_cache_problem

logger = logging.getLogger(__name__)

Drafter = Literal["model", "ngram", "none"]


@dataclass(frozen=True)
class Facts:
    """What the table's conditions read: the model's facts, the config, and the call once it is known."""

    model: ModelFacts
    config: TriForceConfig
    call: Call | None = None
    level1_steps: StepMode = "dynamic"
    generate_kwargs: dict[str, Any] | None = None  # before generate() prepares anything
    assistant: ModelFacts | None = None  # the call's assistant_model, read once with the target's


@dataclass(frozen=True)
class Call:
    """One ``generate()`` call as TriForce receives it (``custom_generate``'s arguments)."""

    input_ids: torch.Tensor
    generation: Any  # the call's GenerationConfig
    model_kwargs: dict[str, Any]
    streamer: Any
    stopping_criteria: Any
    assistant: torch.nn.Module | None
    target: torch.nn.Module

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def mask(self) -> torch.Tensor:
        """``[B, n]`` the prompts' attention mask (all ones when none was given)."""
        mask = self.model_kwargs.get("attention_mask")
        return torch.ones_like(self.input_ids) if mask is None else mask

    @property
    def batched(self) -> bool:
        """Several rows, or one with left padding: rows may carry padding and holes."""
        return self.rows > 1 or not bool((self.mask == 1).all())


@dataclass(frozen=True)
class Limit:
    """One row of the capability table: ``feature`` cannot run while ``blocks(facts)`` is true (a string: the
    condition in detail, for the message); asking for it then raises ``fault``, saying ``why`` and ``instead``."""

    feature: str
    why: str
    fault: type[TriForceError]
    instead: str
    blocks: Callable[[Facts], bool | str | None] = dataclasses.field(repr=False, compare=False)

    def error(self, detail: bool | str | None = None) -> TriForceError:
        why = detail if isinstance(detail, str) else self.why
        return self.fault(f"{self.feature} cannot run here: {why}. {self.instead}")


def _cache_implementation(f: Facts) -> str | None:
    implementation = f.generate_kwargs["effective_cache_implementation"]  # what generate() will act on
    return None if implementation in (None, "dynamic") else f"cache_implementation={implementation!r} was given"


def _stop_strings(f: Facts) -> Any:
    return f.generate_kwargs.get("stop_strings") or f.generate_kwargs["generation_config"].stop_strings


def _two_draft_models(f: Facts) -> bool:
    kwargs = f.generate_kwargs
    return kwargs.get("draft_model") is not None and kwargs.get("assistant_model") not in (None, kwargs["draft_model"])


def _gc(f: Facts) -> Any:
    return f.call.generation


def _scored(f: Facts) -> bool:
    return bool(_gc(f).return_dict_in_generate and (_gc(f).output_scores or _gc(f).output_logits))


def _masked_extras(f: Facts) -> bool:
    """Attention that runs the model's own implementation with a batch's slots as its mask."""
    return f.model.sliding or f.model.softcap or f.model.sinks


def _stops_without_eos(criteria) -> bool:
    """Whether a criterion other than the length limits may stop a row while no EOS criterion pads stopped rows."""
    names = {type(c).__name__ for c in criteria}
    has_eos = any(hasattr(c, "eos_token_id") for c in criteria)
    return not has_eos and bool(names - {"MaxLengthCriteria", "MaxTimeCriteria"})


def _context_problem(f: Facts) -> str | None:
    prompt, limit, max_length = f.call.input_ids.shape[1], context_limit(f.call.target), _gc(f).max_length
    if limit is None or max_length <= limit:
        return None
    if prompt >= limit:
        return f"the prompt has {prompt} tokens and the model's context limit is {limit} (max_position_embeddings)"
    return (
        f"{prompt} prompt tokens + {max_length - prompt} new tokens exceed the model's context limit of {limit} "
        f"(max_position_embeddings); set max_new_tokens to at most {limit - prompt}"
    )


def _assistant_problem(f: Facts) -> str | None:
    problem = f.assistant.unsupported
    if problem is not None:
        return f"assistant_model is {problem}"
    target, draft = vocab_size(f.call.target), vocab_size(f.call.assistant)
    if target != draft:
        return f"assistant_model has a vocabulary of {draft} tokens and the target {target}"
    return None


_GENERATE = "TriForce generation"
_BATCH = "A batch (several rows, or a left-padded row)"
_FIXED = "Fixed-shape steps (cuda_graphs='eager' or True)"
_GRAPHS = "CUDA graphs (cuda_graphs=True)"
_INT8 = "level1_weights='int8'"
_INT4 = "level1_weights='int4'"
_TREES = "Token trees (tree_budget=N)"
_OFFLOAD = "offload_kv=True"
_DRAFT_MODEL = "drafter='model'"
_REUSE = "Starting from the cache passed to generate()"
_DIRECT = "Level 1's direct forward (chosen automatically)"
_MODEL = "TriForce on this model"
_SAMPLING = "Sampling"
_TWO_DRAFTS = "draft_model="
_CUSTOM = "triforce_config="
_STOPS = "stop_strings="
_CACHE = "cache_implementation="
_ASSISTANT = "assistant_model="

_SERVED = (
    "TriForce serves decoder-only causal LMs with rotary embeddings whose attention goes through transformers' "
    f"attention interface (tested: {', '.join(TESTED_MODEL_TYPES)}; the documentation's Supported models page); use "
    "plain generate() for this one."
)
_PLAIN = "Drop triforce_config for this call (plain generate() serves it), or change the option."
_SDPA = "Load the model with attn_implementation='sdpa' (or 'eager')."

# fmt: off
LIMITS: tuple[Limit, ...] = (
    # The model itself (enable(), and every call).
    Limit(_MODEL, "it is not a decoder-only causal LM with rotary embeddings and per-token keys/values", Model,
          _SERVED, lambda f: f.model.unsupported),
    Limit(_MODEL, "its attention implementation has no causal-mask function", Model, _SDPA,
          lambda f: f.model.attention != "eager" and not has_mask_function(f.model.attention)
          and f"attn_implementation={f.model.attention!r} has no causal-mask function"),
    Limit(_MODEL, "a token's logits in a forward of several tokens depend on the other tokens (bitsandbytes' LLM.int8 "
          "outlier split), so verifying drafts cannot give plain decoding's tokens", Model,
          "Load it with BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0) (no outlier split) or "
          "load_in_4bit=True, or use plain generate().", lambda f: f.model.rows_interact),
    # generate()'s options; a cache_implementation is refused before generate() builds that cache.
    Limit(_CACHE, "TriForce keeps its own full cache and level-1 view", Generation,
          "Drop cache_implementation; to reuse a prefilled prefix, pass a DynamicCache as cache=.",
          _cache_implementation),
    Limit(_GENERATE, "beam search (num_beams > 1)", Generation, _PLAIN, lambda f: (_gc(f).num_beams or 1) > 1),
    Limit(_GENERATE, "an empty prompt", Generation, "Pass at least one prompt token.",
          lambda f: f.call.input_ids.shape[1] == 0),
    Limit(_GENERATE, "use_cache=False", Generation, "Drop use_cache=False.",
          lambda f: f.call.model_kwargs.get("use_cache") is False),
    Limit(_GENERATE, "output_attentions / output_hidden_states", Generation, _PLAIN,
          lambda f: bool(_gc(f).output_attentions or _gc(f).output_hidden_states)),
    Limit(_GENERATE, "contrastive search (penalty_alpha)", Generation, _PLAIN, lambda f: bool(_gc(f).penalty_alpha)),
    Limit(_GENERATE, "prompt_lookup_num_tokens / assistant_early_exit (another drafter)", Generation,
          "TriForce drafts itself: prompt_lookup_num_tokens=N maps to TriForceConfig(drafter='ngram', gamma1=N) "
          "(n-gram lookup at level 0); assistant_early_exit has no counterpart (level 0: lookup or assistant_model=).",
          lambda f: _gc(f).prompt_lookup_num_tokens is not None or _gc(f).assistant_early_exit is not None),
    Limit(_GENERATE, "inputs_embeds", Generation, "Pass input_ids.",
          lambda f: f.call.model_kwargs.get("inputs_embeds") is not None),
    Limit(_GENERATE, "classifier-free guidance (guidance_scale runs the model a step at a time on its own cache)",
          Generation, _PLAIN, lambda f: _gc(f).guidance_scale not in (None, 1, 1.0)),
    Limit(_GENERATE, "the prompt and max_new_tokens exceed the model's context", Generation,
          "Shorten the prompt or max_new_tokens.", _context_problem),
    # Level 0.
    Limit(_DRAFT_MODEL, "no draft model was passed", Config,
          "Pass assistant_model=<a small model of the same tokenizer> to generate(), or use drafter='ngram'.",
          lambda f: f.config.drafter == "model" and f.call.assistant is None),
    Limit(_DRAFT_MODEL, "the draft model cannot draft for this model", Model,
          "Use a draft model of the same family and tokenizer, or drafter='ngram' / 'none'.",
          lambda f: f.call.assistant is not None and _assistant_problem(f)),
    Limit(_ASSISTANT, "the config's drafter does not use a draft model", Config,
          "Use drafter='model' (or 'auto'), or drop assistant_model.",
          lambda f: f.call.assistant is not None and f.config.drafter not in ("model", "auto")),
    Limit(_TWO_DRAFTS, "assistant_model= and draft_model= name two different draft models", Generation,
          "Pass one of them.", _two_draft_models),
    Limit(_CUSTOM, "custom_generate= names another decoding method", Generation,
          "Pass triforce_config or custom_generate, not both.",
          lambda f: f.generate_kwargs.get("custom_generate") is not None),
    Limit(_STOPS, "stop strings need the tokenizer, and generate() was given none", Generation,
          "Pass tokenizer=<your tokenizer> to generate().",
          lambda f: _stop_strings(f) is not None and f.generate_kwargs.get("tokenizer") is None),
    Limit(_SAMPLING, "the ranks of this tensor-parallel model start from different random states", Generation,
          "Seed every rank alike before generate(): torch.manual_seed(seed) on every rank.",
          lambda f: random_states_differ(RankConsensus.for_model(f.call.target))),
    # Reusing a caller's cache.
    Limit(_REUSE, "it is not a cache TriForce can start from", Generation,
          "Pass a DynamicCache prefilled by this model, the cache an earlier TriForce call returned, or no cache.",
          lambda f: callers_cache_problem(f.call.target, callers_cache(f.call.model_kwargs), f.call.input_ids.shape)),
    # Batches.
    Limit(_BATCH, "a row whose last token is padding", Generation,
          "Pad batches on the left (tokenizer.padding_side = 'left').",
          lambda f: bool((f.call.mask[:, -1] == 0).any())),
    Limit(_BATCH, "a row with no token (an all-zero attention_mask row)", Generation, "Drop the empty rows.",
          lambda f: bool((f.call.mask.sum(dim=1) == 0).any())),
    Limit(_BATCH, "a streamer with several rows", Generation,
          "transformers' streamers take one row: stream one sequence per call.",
          lambda f: f.call.streamer is not None and f.call.rows > 1),
    Limit(_BATCH, "output_scores / output_logits with several rows", Generation,
          "Plain generate() scores the padding of rows that finished early, which TriForce never computes: drop "
          "output_scores/output_logits or pass one row.", lambda f: f.call.rows > 1 and _scored(f)),
    Limit(_BATCH, "stop strings or stopping criteria without an eos_token_id", Generation,
          "Pass eos_token_id= (plain generate() keeps decoding the rows they stop instead of padding them).",
          lambda f: _stops_without_eos(f.call.stopping_criteria)),
    Limit(_BATCH, "sliding windows, soft-capped logits or learned sinks under an attention that takes no mask tensor",
          Model, _SDPA, lambda f: f.model.attention not in ("sdpa", "eager") and _masked_extras(f)),
    # The full cache in host memory.
    Limit(_OFFLOAD, "the model is dispatched by accelerate (device_map over several devices, or offloaded weights)",
          Model, "Load it on one GPU (device_map='cuda'), or drop offload_kv.", lambda f: f.model.dispatched),
    Limit(_OFFLOAD, "the offloaded cache does not fit", Generation,
          "Shorten the prompt or max_new_tokens, or pass fewer rows.",
          lambda f: offload_fit_problem(f.call.target, f.config, f.call.rows, _gc(f).max_length)),
    # Fixed shapes and CUDA graphs.
    Limit(_FIXED, "the attention is neither sdpa nor eager", Model,
          "Load the model with attn_implementation='sdpa', or use cuda_graphs=False.",
          lambda f: not f.model.fixed_masks and f"attn_implementation={f.model.attention!r} is neither sdpa nor eager"),
    Limit(_FIXED, "the model is dispatched by accelerate", Model, "Use cuda_graphs=False.",
          lambda f: f.model.dispatched),
    Limit(_GRAPHS, "the model is not on a CUDA device", Device,
          "Use cuda_graphs='eager' (the same fixed-shape steps without graphs), 'auto' or False.",
          lambda f: f.model.device != "cuda" and f"the model is on {f.model.device}, not a CUDA device"),
    Limit(_GRAPHS, "its RoPE recomputes the frequencies from the positions on the host", Model,
          "Use cuda_graphs='eager' or False.", lambda f: f.model.dynamic_rope),
    # Level 1's weights.
    *(Limit(weights, "the model's linear layers are already quantized (the copy is made from plain float weights)",
            Model, "Use level1_weights='auto' or 'full': level 1 then drafts with the model's own quantized layers.",
            lambda f: f.model.quantized and f"{f.model.quantized}, and the copy is made from plain float weights")
      for weights in (_INT8, _INT4)),
    Limit(_INT8, "the int8 kernel runs on the CPU only", Device, "Use level1_weights='int4' on a GPU, or 'full'.",
          lambda f: f.model.device != "cpu"),
    Limit(_INT8, "this torch has no torch._weight_int8pack_mm", Device, "Use level1_weights='full'.",
          lambda f: not f.model.int8_kernel),
    Limit(_INT4, "the model is on neither the CPU nor a CUDA device", Device, "Use level1_weights='full'.",
          lambda f: f.model.device not in ("cpu", "cuda")),
    Limit(_INT4, "this torch or device has no int4 weight-only kernel (CUDA: compute capability 8.0+)", Device,
          "Use level1_weights='full'.", lambda f: not f.model.int4_kernel),
    Limit(_INT4, "on the CPU it keeps the LM head in int8, and this torch has no torch._weight_int8pack_mm", Device,
          "Use level1_weights='full'.", lambda f: f.model.device == "cpu" and not f.model.int8_kernel),
    *(Limit(weights, "the model's CPU weights are neither float32 nor bfloat16", Model, "Use level1_weights='full'.",
            lambda f: f.model.device == "cpu" and f.model.dtype not in (torch.float32, torch.bfloat16))
      for weights in (_INT8, _INT4)),
    *(Limit(weights, "the model is dispatched by accelerate or sharded over tensor-parallel ranks", Model,
            "Use level1_weights='full'.", lambda f: f.model.dispatched or f.model.tensor_parallel)
      for weights in (_INT8, _INT4)),
    # Token trees.
    Limit(_TREES, "a batch verifies chains", Generation, "Use tree_budget='auto' or 0.", lambda f: f.call.batched),
    Limit(_TREES, "trees attend through sdpa or eager attention", Model,
          "Use tree_budget='auto' or 0, or load the model with attn_implementation='sdpa'.",
          lambda f: f.model.attention not in ("sdpa", "eager")),
    Limit(_TREES, "level 1 runs fixed shapes (cuda_graphs), and a tree's frontier changes width", Config,
          "Use tree_budget='auto' or 0, or cuda_graphs=False.", lambda f: f.level1_steps != "dynamic"),
    Limit(_TREES, "tensor-parallel ranks agree on chains only", Model, "Use tree_budget='auto' or 0.",
          lambda f: f.model.tensor_parallel),
    # Chosen automatically: what blocks them makes the call take the other form (FALLBACKS), never an error.
    Limit(_DIRECT, "the model is not on the CPU (on a GPU, CUDA graphs remove the per-module overhead)", Device, "",
          lambda f: f.model.device != "cpu"),
    Limit(_DIRECT, "level 1 runs fixed shapes", Config, "", lambda f: f.level1_steps != "dynamic"),
    Limit(_DIRECT, "rows carry padding or holes (it serves one unpadded sequence)", Generation, "",
          lambda f: f.call.batched),
    Limit(_DIRECT, "its layers are not a layout it runs", Model, "", lambda f: f.model.direct_layout),
)
# fmt: on
"""The capability table: every refusal of a TriForce call, and every reason an automatic choice takes another form."""

FALLBACKS = {
    _GRAPHS: "cuda_graphs='auto' runs dynamic shapes",
    _INT8: "level1_weights='auto' uses the target's own weights",
    _INT4: "level1_weights='auto' tries int8, then the target's own weights",
    _TREES: "tree_budget='auto' drafts chains",
    _DIRECT: "level 1 runs transformers' forward",
}
"""What an ``"auto"`` option (or an automatic choice) does where :data:`LIMITS` blocks the feature."""


@dataclass(frozen=True)
class CallPlan:
    """What one TriForce call runs, decided by :func:`plan_call` before any forward.

    Attributes:
        drafter: level 0: ``"model"``, ``"ngram"`` or ``"none"``.
        rows: sequences in the call.
        batched: rows carry padding or holes (several rows, or a left-padded one): attention goes through slots.
        level1_steps: level 1's steps: ``"dynamic"`` shapes, fixed shapes run ``"eager"``ly, or CUDA ``"graphs"``.
        level1_forward: ``"direct"`` (plain torch calls over the weights) or ``"transformers"`` (the model's forward).
        level1_weights: ``"full"``, ``"int8"`` or ``"int4"``.
        draft_steps: the draft model's steps (``"dynamic"`` without one).
        trees: level 1 may draft token trees (``tree_budget``).
        offload: the full cache lives in host memory.
        strict_graphs: ``cuda_graphs=True``: a failed graph capture raises instead of running eagerly.
        tensor_parallel: the model is sharded over ranks (rank 0's adaptive decisions are broadcast).
    """

    drafter: Drafter
    rows: int
    batched: bool
    level1_steps: StepMode
    level1_forward: Literal["direct", "transformers"]
    level1_weights: Literal["full", "int8", "int4"]
    draft_steps: StepMode
    trees: bool
    offload: bool
    strict_graphs: bool
    tensor_parallel: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def blocked(facts: Facts, feature: str) -> list[tuple[Limit, bool | str]]:
    """The limits of ``feature`` that block it under ``facts``, with each one's detail."""
    return [(limit, detail) for limit in LIMITS if limit.feature == feature and (detail := limit.blocks(facts))]


def refuse(facts: Facts, feature: str) -> None:
    """Raise the first limit that blocks ``feature`` (the one the user asked for explicitly)."""
    for limit, detail in blocked(facts, feature):
        raise limit.error(detail)


def available(facts: Facts, feature: str) -> bool:
    """Whether nothing blocks ``feature`` (an automatic choice); what blocks it is logged."""
    reasons = blocked(facts, feature)
    if reasons:
        why = "; ".join(d if isinstance(d, str) else limit.why for limit, d in reasons)
        logger.info("%s: not this call (%s); %s.", feature, why, FALLBACKS.get(feature, "skipped"))
    return not reasons


def check_model(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless TriForce can serve ``model`` at all (``enable()``'s check)."""
    refuse(Facts(model_facts(model), TriForceConfig()), _MODEL)


def check_generate_kwargs(model: torch.nn.Module, generate_kwargs: dict[str, Any]) -> ModelFacts:
    """Refuse what must be refused before ``generate()`` prepares anything (it would build a ``cache_implementation``'s
    cache; stop strings need the tokenizer it then drops); the model's facts it read, for :func:`plan_call`."""
    kwargs = {
        **generate_kwargs,
        "generation_config": generate_kwargs.get("generation_config") or model.generation_config,
        "effective_cache_implementation": effective_cache_implementation(model, generate_kwargs),
    }
    facts = Facts(model_facts(model), TriForceConfig(), generate_kwargs=kwargs)
    for feature in (_CACHE, _CUSTOM, _STOPS, _TWO_DRAFTS):
        refuse(facts, feature)
    return facts.model


def plan_call(model: torch.nn.Module, config: TriForceConfig, call: Call, known: ModelFacts | None = None) -> CallPlan:
    """The plan of one call: every refusal first (:data:`LIMITS`), then each level's form. ``known``: the model's
    facts as :func:`check_generate_kwargs` read them for this call (else read here); each model is read once a call.

    Example:
        >>> plan = plan_call(model, TriForceConfig(), call)  # doctest: +SKIP
        >>> plan.level1_forward, plan.level1_weights, plan.level1_steps  # a Llama on the CPU  # doctest: +SKIP
        ('direct', 'int4', 'dynamic')
    """
    assistant = None if call.assistant is None else model_facts(call.assistant)
    facts = Facts(known or model_facts(model), config, call, assistant=assistant)
    asked = {_BATCH: call.batched, _OFFLOAD: config.offload_kv, _SAMPLING: call.generation.do_sample}
    for feature in (_MODEL, _GENERATE, _DRAFT_MODEL, _ASSISTANT, _REUSE, _BATCH, _OFFLOAD, _SAMPLING):
        if asked.get(feature, True):
            refuse(facts, feature)
    facts = dataclasses.replace(facts, level1_steps=_steps(facts, config.cuda_graphs))
    drafter = _drafter(config, call.assistant)
    draft_steps = "dynamic"
    if drafter == "model":
        draft_steps = _steps(Facts(assistant, config, call), config.cuda_graphs)
    direct = available(facts, _DIRECT)
    return CallPlan(
        drafter=drafter,
        rows=call.rows,
        batched=call.batched,
        level1_steps=facts.level1_steps,
        level1_forward="direct" if direct else "transformers",
        level1_weights=_weights(facts, config.level1_weights, direct),
        draft_steps=draft_steps,
        trees=_trees(facts, config.tree_budget),
        offload=config.offload_kv,
        strict_graphs=config.cuda_graphs is True,
        tensor_parallel=facts.model.tensor_parallel,
    )


def _steps(facts: Facts, setting: bool | str) -> StepMode:
    """``TriForceConfig.cuda_graphs`` for one model: ``"dynamic"``, ``"eager"`` or ``"graphs"``."""
    if setting is False:
        return "dynamic"
    if setting == "eager":
        refuse(facts, _FIXED)
        return "eager"
    if setting is True:
        refuse(facts, _GRAPHS)
        refuse(facts, _FIXED)
        return "graphs"
    on_cuda = facts.model.device == "cuda"  # "auto": graphs where they run
    return "graphs" if on_cuda and available(facts, _GRAPHS) and available(facts, _FIXED) else "dynamic"


def _weights(facts: Facts, choice: str, direct: bool) -> str:
    """``TriForceConfig.level1_weights``: an explicit low-bit copy that cannot run raises; ``"auto"`` is ``"int4"``
    for the direct forward, else ``"int8"``, where they run on the CPU, and ``"full"`` elsewhere (no GPU run has yet
    measured a low-bit copy faster end to end)."""
    if choice in ("int8", "int4"):
        refuse(facts, _INT8 if choice == "int8" else _INT4)
        return choice
    if choice == "full" or facts.model.device != "cpu":
        return "full"
    if direct and available(facts, _INT4):
        return "int4"
    return "int8" if available(facts, _INT8) else "full"


def _trees(facts: Facts, budget: int | str) -> bool:
    if budget == 0:
        return False
    if budget != "auto":
        refuse(facts, _TREES)
        return True
    return available(facts, _TREES)


def _drafter(config: TriForceConfig, assistant: torch.nn.Module | None) -> Drafter:
    if config.drafter == "auto":
        return "model" if assistant is not None else "ngram"
    return config.drafter


def compatibility_markdown() -> str:
    """The docs' compatibility page body: every row of :data:`LIMITS`, grouped by feature, with the error it raises
    and, for an automatic choice, what the call does instead (a test keeps ``docs/compatibility.md`` equal to it).

    Example:
        >>> compatibility_markdown().splitlines()[0]
        '| Feature | Does not run when | Raises | Instead |'
    """
    lines = ["| Feature | Does not run when | Raises | Instead |", "|---|---|---|---|"]
    for limit in LIMITS:
        instead = limit.instead or f"(automatic) {FALLBACKS[limit.feature]}"
        fault = "-" if not limit.instead else f"`{limit.fault.__name__}`"
        lines.append(f"| {limit.feature} | {limit.why} | {fault} | {instead.replace('|', '/')} |")
    auto = ["", 'Where an `"auto"` option meets a limit above, the call takes another form instead of raising:', ""]
    auto += [f"- {feature}: {fallback}." for feature, fallback in FALLBACKS.items() if feature != _DIRECT]
    return "\n".join(lines + auto) + "\n"
