"""Peak device memory of plain and TriForce ``generate()`` calls, by term, known before anything is loaded.

Whether a benchmark row fits a GPU, and the longest context that does, is
:mod:`research.memory_fit`. Each estimate is a :class:`MemoryEstimate` of named terms, in bytes:

* *exact* terms are allocation sizes read off the code that allocates them: the weights, transformers'
  ``DynamicCache``, hf_triforce's ``RetrievalCache``, its chunk summaries, its retrieval views and the draft
  model's StreamingLLM cache;
* *estimated* terms are the largest set of temporaries alive at once (a forward's activations, attention masks,
  copies), counted from the code path taken on CUDA, rounded up, and summed where they might coincide.

Facts checked in the installed transformers (5.23) and torch sources:

* ``cache_utils.DynamicLayer.update`` appends with ``self.keys = torch.cat([self.keys, key_states], -2)`` and
  then the same for the values: while one tensor is concatenated, its old and new copies are both alive, so
  plain decoding briefly holds one layer's keys twice (the old keys are freed before the values are
  concatenated). The cache ``generate()`` builds for Llama is a ``DynamicCache`` of ``DynamicLayer``\\ s.
* ``generation/utils.py``, ``GenerationMixin.generate``: ``model_kwargs["logits_to_keep"] = 1`` whenever the
  forward accepts it (``LlamaForCausalLM`` does: ``slice_logits_to_keep`` before ``lm_head``), so the prefill
  computes ``[1, 1, vocab]`` logits, not ``[1, prompt, vocab]``. ``GenerationMixin._prefill`` splits the prompt
  into ``generation_config.prefill_chunk_size`` pieces when that is set.
* ``masking_utils.sdpa_mask`` returns ``None`` (no mask; ``sdpa_attention_forward`` passes ``is_causal``) when
  ``_ignore_causal_mask_sdpa`` holds: the padding mask is all ones and ``q_length == 1`` or
  ``q_length == kv_length``, or the cache is empty. A one-forward prefill of an unpadded batch of one therefore
  builds no ``[P, P]`` mask; a forward of ``q > 1`` tokens after cached ones (a chunk of a chunked prefill,
  TriForce's verification) materializes a ``[1, 1, q, kv]`` boolean mask.
* ``integrations/sdpa_attention.py``: with a mask, ``use_gqa_in_sdpa`` is false on CUDA and a GQA model's keys
  and values go through ``repeat_kv`` (a copy of one layer's cache at the query-head count); without one,
  ``enable_gqa=True`` copies nothing.
* torch's ``scaled_dot_product_attention`` turns a boolean mask into an additive one of the query's dtype
  (``convert_boolean_attn_mask``: ``zeros_like`` + ``masked_fill_(mask.logical_not(), -inf)``), and the
  memory-efficient kernel pads its last dimension to a multiple of 16 (``preprocess_mask``/``pad_bias``).
* ``LlamaModel.forward`` keeps ``inputs_embeds`` alive for the whole forward; ``LlamaMLP`` holds
  ``act(gate)``, ``up`` and their product at once; ``LlamaRMSNorm`` computes in float32.

And in hf_triforce, whose capacities ``TriForceConfig`` derives (this model reads them from there): the
generation loop (``generation/loop.py``) reserves ``TriForceConfig.full_cache_capacity(max_length)`` slots per
full-attention layer up front (``KVBuffer.reserve`` allocates ``max(size, capacity)`` on the first append and
doubles only past that, which ``max_length`` rules out), and ``window - 1 + gamma1 + gamma2 + 1`` per sliding
layer (``SlidingLayer``: never doubled); ``ChunkSummaries._grow`` allocates ``capacity // chunk_size + 1``
mean keys per full layer and KV head on the first selection; level 1 keeps one view, re-selected in its storage:
``selected + TriForceConfig.view_extra_capacity`` slots on the dynamic path (new storage, the old one dropped
first, only when a selection outgrows it), a fixed ``StaticRetrievalView`` of ``TriForceConfig.view_capacity``
slots on the fixed-shape path.

Example:
    >>> from research.shapes import preset_config
    >>> from hf_triforce.config import TriForceConfig
    >>> est = triforce_generate_estimate(preset_config("llama3.1-8b", 131072), 131072, 2, TriForceConfig())
    >>> est.describe()
    'weights 15.0 + KV cache 16.0 + prefill activations 14.6 GiB'
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hf_triforce.bench.bandwidth import (
    attended_kv_bytes,
    head_dim,
    kv_bytes_per_token,
    kv_heads,
    text_config,
    weight_bytes,
)
from hf_triforce.bench.memory import layer_keys_bytes, summaries_bytes, triforce_kv_bytes, view_bytes
from hf_triforce.config import DRAFT_SINKS, TriForceConfig

GIB = 2**30
FLOAT32 = 4
INDEX_BYTES = 8  # int64: position ids, a selection's token indices


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak device bytes of one ``generate()`` call, by term.

    Exact (allocated) terms: ``weights``; ``kv`` (the full cache); ``summaries`` and ``view`` (TriForce's chunk
    summaries and its retrieval view); ``draft`` (the level-0 model: weights, cache, forward).
    Estimated (transient) terms: ``prefill`` (alive during the prompt forward(s)) and ``decode`` (alive while
    decoding, beside the summaries and the view, which are only allocated after the prefill).

    Example:
        >>> MemoryEstimate(weights=10, kv=20, prefill=5, decode=1, summaries=2).total
        35
    """

    weights: int
    kv: int
    prefill: int
    decode: int
    summaries: int = 0
    view: int = 0
    draft: int = 0
    kept_view: int = 0

    @property
    def after_prefill(self) -> int:
        """Bytes allocated after the prefill: summaries, views and decoding transients."""
        return self.summaries + self.view + self.decode

    @property
    def total(self) -> int:
        """Peak bytes: ``weights + draft + kept_view + kv + max(prefill, summaries + view + decode)``."""
        return self.weights + self.draft + self.kept_view + self.kv + max(self.prefill, self.after_prefill)

    @property
    def prefill_bound(self) -> bool:
        """Whether the prefill's transients, not the decoding phase, set the peak."""
        return self.prefill > self.after_prefill

    def describe(self) -> str:
        """The terms of the peak in GiB, e.g. ``"weights 12.6 + KV cache 58.6 + prefill activations 11.1 GiB"``."""
        phase = ("prefill",) if self.prefill_bound else ("summaries", "view", "decode")
        names = ("weights", "draft", "kept_view", "kv", *phase)
        parts = [f"{_LABELS[n]} {getattr(self, n) / GIB:.1f}" for n in names if getattr(self, n)]
        return " + ".join(parts) + " GiB"


_LABELS = {"weights": "weights", "draft": "draft model", "kv": "KV cache", "prefill": "prefill activations",
           "summaries": "chunk summaries", "view": "retrieval view", "decode": "decoding transients",
           "kept_view": "TriForce view kept from an earlier call"}  # fmt: skip


def activation_bytes_per_token(config, dtype_bytes: int) -> int:
    """Transient bytes per token of a forward: the most one decoder layer holds at once. Estimate.

    The int64 position ids and the RoPE ``cos``/``sin`` tables (``2 x head_dim``), alive for the whole forward,
    plus the largest of three
    phases of a Llama layer (``h`` hidden, ``i`` intermediate, ``q``/``kv`` query/key widths): the MLP,
    ``4h + 3i`` elements (the embeddings ``LlamaModel.forward`` keeps alive, the layer's input, the residual, the
    normed input; ``act(gate)``, ``up`` and their product); the attention, ``3h + 4q + 2kv`` (RoPE holds ``q``,
    ``q * cos``, ``rotate_half(q) * sin`` and ``q_embed`` beside ``k`` and ``v``); the float32 RMSNorm, ``2h``
    elements plus ``2h`` float32 values. The MLP phase is what a bf16 prefill on the CPU peaks at, byte for byte
    (live tensor storage tracked with a ``TorchDispatchMode``).

    Example:
        >>> from research.shapes import preset_config
        >>> activation_bytes_per_token(preset_config("llama2-7b", 4096), 2)  # 8 + (2 x 128 + 4 x 4096 + 3 x 11008) x 2
        99336
    """
    h, d = config.hidden_size, head_dim(config)
    q, kv = config.num_attention_heads * d, kv_heads(config) * d
    mlp = (4 * h + 3 * config.intermediate_size) * dtype_bytes
    attention = (3 * h + 4 * q + 2 * kv) * dtype_bytes
    norm = 2 * h * dtype_bytes + 2 * h * FLOAT32
    return INDEX_BYTES + 2 * d * dtype_bytes + max(mlp, attention, norm)


def mask_bytes(queries: int, keys: int, dtype_bytes: int) -> int:
    """Bytes of a materialized ``[1, 1, queries, keys]`` attention mask while sdpa uses it. Estimate.

    transformers' boolean mask (1 byte an element, exact), plus torch's conversion to an additive mask of the
    query's dtype: ``logical_not`` (1 byte) and ``zeros_like`` (``dtype_bytes``), or, once ``logical_not`` is
    freed, the memory-efficient kernel's copy padded to a multiple of 16 keys (``dtype_bytes``).

    Example:
        >>> mask_bytes(8192, 131072, 2) / 2**30  # GiB: a prefill chunk of 8192 tokens after 120K cached ones
        5.0
    """
    return queries * keys * (1 + max(1 + dtype_bytes, 2 * dtype_bytes))


def repeat_kv_bytes(config, keys: int, dtype_bytes: int) -> int:
    """Bytes of transformers' ``repeat_kv`` copy of one layer's ``keys`` tokens (GQA with a mask). Exact when it runs.

    Example:
        >>> from research.shapes import preset_config
        >>> repeat_kv_bytes(preset_config("llama3.1-8b", 4096), 1024, 2) / 2**20  # 32 query heads, K and V
        16.0
    """
    if config.num_attention_heads == kv_heads(config):
        return 0
    return 2 * keys * config.num_attention_heads * head_dim(config) * dtype_bytes


def logits_bytes(config, positions: int, dtype_bytes: int) -> int:
    """Logits of ``positions`` positions: the model's (its dtype), a float32 copy and processed scores. Estimate.

    Example:
        >>> from research.shapes import preset_config
        >>> logits_bytes(preset_config("llama2-7b", 4096), 1, 2)
        320000
    """
    return positions * config.vocab_size * (dtype_bytes + 2 * FLOAT32)


def forward_bytes(config, tokens: int, attended: int, dtype_bytes: int, keep: int = 1) -> int:
    """Transient bytes of one forward of ``tokens`` new tokens attending to ``attended`` (cached + new). Estimate.

    Activations of ``tokens`` tokens, plus, when transformers materializes a mask (``tokens > 1`` after cached
    tokens), the mask and a GQA model's ``repeat_kv`` copy; plus the logits of the last ``keep`` positions.

    Example:
        >>> from research.shapes import preset_config
        >>> cfg = preset_config("llama2-7b", 4096)
        >>> forward_bytes(cfg, 4096, 4096, 2) == 4096 * activation_bytes_per_token(cfg, 2) + logits_bytes(cfg, 1, 2)
        True
    """
    masked = 1 < tokens < attended
    attention = mask_bytes(tokens, attended, dtype_bytes) + repeat_kv_bytes(config, attended, dtype_bytes)
    activations = tokens * activation_bytes_per_token(config, dtype_bytes)
    return activations + (attention if masked else 0) + logits_bytes(config, keep, dtype_bytes)


def prefill_bytes(config, prompt: int, dtype_bytes: int, chunk: int | None = None) -> int:
    """Transient bytes of prefilling ``prompt`` tokens in one forward, or in ``chunk``-token forwards. Estimate.

    A chunked prefill's worst forward is the last: ``chunk`` tokens attending to the whole prompt, with a
    ``[chunk, prompt]`` mask (and a GQA copy of one layer's cache); a one-forward prefill has no mask.

    Example:
        >>> from research.shapes import preset_config
        >>> cfg = preset_config("llama2-7b", 131072)
        >>> prefill_bytes(cfg, 131072, 2, chunk=8192) < prefill_bytes(cfg, 131072, 2)
        True
    """
    step = prompt if chunk is None else min(chunk, prompt)
    return forward_bytes(config, step, prompt, dtype_bytes)


def plain_generate_estimate(
    config, context: int, dtype_bytes: int, prefill_chunk: int | None = None, *, prompt_tokens: int | None = None
) -> MemoryEstimate:
    """Terms of the peak of plain ``model.generate()`` over ``context`` tokens (prompt + new tokens).

    ``kv`` is exact: the ``DynamicCache`` holds ``context`` tokens' keys and values (``generate()`` stops with
    ``prompt + new - 1`` cached). ``decode`` is the ``torch.cat`` regrowth of one layer's keys plus a one-token
    forward; ``prefill`` is :func:`prefill_bytes` (``prefill_chunk``: transformers' ``prefill_chunk_size``), plus
    the regrowth of one layer's keys per chunk when chunked. ``prompt_tokens`` defaults to ``context``.

    Example:
        >>> from research.shapes import preset_config
        >>> est = plain_generate_estimate(preset_config("llama2-7b", 4096), 4096, 2)
        >>> est.kv / 2**30, est.prefill_bound
        (2.0, True)
    """
    config = text_config(config)
    prompt = context if prompt_tokens is None else prompt_tokens
    chunked = prefill_chunk is not None and prefill_chunk < prompt
    regrow = layer_keys_bytes(config, prompt, dtype_bytes) if chunked else 0
    return MemoryEstimate(
        weights=weight_bytes(config, dtype_bytes),
        kv=attended_kv_bytes(config, context, dtype_bytes),  # a sliding layer keeps its window
        prefill=prefill_bytes(config, prompt, dtype_bytes, prefill_chunk) + regrow,
        decode=layer_keys_bytes(config, context, dtype_bytes) + forward_bytes(config, 1, context, dtype_bytes),
    )


def _triforce_decode_bytes(config, context: int, dtype_bytes: int, tc: TriForceConfig) -> int:
    """Transients while decoding, all summed (they are small but for a GQA model's verification). Estimate.

    The full-cache verification of ``gamma2`` drafts (a ``[gamma2 + 1, capacity]`` mask and, for GQA, a
    ``repeat_kv`` copy of one layer's whole cache), a level-1 forward over a view, a selection's indices, one
    layer's summaries being computed and the captured queries.
    """
    tc = tc.for_context(context)
    capacity, g = tc.full_cache_capacity(context), tc.gamma2 + 1
    verify = forward_bytes(config, g, capacity, dtype_bytes, keep=g)
    level1 = forward_bytes(config, tc.gamma1 + 1, tc.retrieval_budget + g, dtype_bytes, keep=tc.gamma1 + 1)
    indices = config.num_hidden_layers * kv_heads(config) * tc.retrieval_budget * INDEX_BYTES
    means = layer_keys_bytes(config, capacity // tc.chunk_size + 1, dtype_bytes)
    queries = config.num_hidden_layers * config.num_attention_heads * head_dim(config) * g * dtype_bytes
    return verify + level1 + indices + means + queries


def draft_cache_bytes(draft_config, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Bytes of the level-0 model's StreamingLLM cache: ``draft_cache_budget`` tokens per layer. Exact.

    Example:
        >>> from research.shapes import preset_config
        >>> draft_cache_bytes(preset_config("draft-68m", 4096), 2, TriForceConfig(draft_cache_budget=256)) / 2**20
        1.5
    """
    return triforce_config.draft_cache_budget * kv_bytes_per_token(text_config(draft_config), dtype_bytes)


def draft_weight_bytes(draft_config, target_config, dtype_bytes: int) -> int:
    """Bytes of the draft model's weights once the benchmark resizes its embeddings to the target's vocabulary.

    Example:
        >>> from research.shapes import preset_config
        >>> draft, target = preset_config("draft-68m", 4096), preset_config("llama2-7b", 4096)
        >>> draft_weight_bytes(draft, target, 2) == weight_bytes(draft, 2)  # same 32000-token vocabulary
        True
    """
    draft = text_config(draft_config)
    extra_rows = text_config(target_config).vocab_size - draft.vocab_size
    tables = 1 if draft.tie_word_embeddings else 2
    return weight_bytes(draft, dtype_bytes) + extra_rows * draft.hidden_size * tables * dtype_bytes


def draft_bytes(draft_config, target_config, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Level-0 model: weights, StreamingLLM cache and its largest forward: the window after the sinks
    (``draft_cache_budget - DRAFT_SINKS`` new tokens) over the whole cache.

    Example:
        >>> from research.shapes import preset_config
        >>> draft, target = preset_config("draft-68m", 4096), preset_config("llama2-7b", 4096)
        >>> 0 < draft_bytes(draft, target, 2, TriForceConfig()) - draft_weight_bytes(draft, target, 2) < 2**30
        True
    """
    tc = triforce_config
    window = tc.draft_cache_budget - DRAFT_SINKS
    forward = forward_bytes(text_config(draft_config), window, tc.draft_cache_budget, dtype_bytes)
    weights = draft_weight_bytes(draft_config, target_config, dtype_bytes)
    return weights + draft_cache_bytes(draft_config, dtype_bytes, tc) + forward


def triforce_generate_estimate(
    config,
    context: int,
    dtype_bytes: int,
    triforce_config: TriForceConfig,
    draft_config=None,
    *,
    prompt_tokens: int | None = None,
) -> MemoryEstimate:
    """Terms of the peak of TriForce ``generate()`` over ``context`` tokens (prompt + new tokens).

    ``kv``, ``summaries`` and ``view`` (one view) are exact; ``prefill`` is :func:`prefill_bytes`
    for ``triforce_config.prefill_chunk_size`` (the cache is written in place: no regrowth); ``decode`` is
    :func:`_triforce_decode_bytes`; ``draft`` is :func:`draft_bytes` when a draft model's config is given.

    Example:
        >>> from research.shapes import preset_config
        >>> est = triforce_generate_estimate(preset_config("llama2-7b", 4096), 32768, 2, TriForceConfig())
        >>> round(est.kv / 2**30, 3), round(est.summaries / est.kv, 3)  # the summaries: 1/16 of the cache
        (16.004, 0.063)
    """
    config, tc = text_config(config), triforce_config
    prompt = context if prompt_tokens is None else prompt_tokens
    return MemoryEstimate(
        weights=weight_bytes(config, dtype_bytes),
        kv=triforce_kv_bytes(config, context, dtype_bytes, tc),
        prefill=prefill_bytes(config, prompt, dtype_bytes, tc.prefill_chunk_size),
        decode=_triforce_decode_bytes(config, context, dtype_bytes, tc),
        summaries=summaries_bytes(config, context, dtype_bytes, tc),
        view=view_bytes(config, context, dtype_bytes, tc),
        draft=0 if draft_config is None else draft_bytes(draft_config, config, dtype_bytes, tc),
    )


def batch_estimate(estimate: MemoryEstimate, batch: int) -> MemoryEstimate:
    """The estimate of ``batch`` rows: every term but the weights (the target's and the draft model's) is per row.

    Example:
        >>> batch_estimate(MemoryEstimate(weights=10, kv=20, prefill=5, decode=1), 4).total  # 10 + 80 + 20
        110
    """
    per_row = ("kv", "prefill", "decode", "summaries", "view", "kept_view")
    return replace(estimate, **{name: getattr(estimate, name) * batch for name in per_row})
