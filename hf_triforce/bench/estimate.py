"""``hf-triforce estimate``: will TriForce help this model at this context on this GPU? Answered from the config alone.

The bandwidth model (:mod:`~hf_triforce.bench.bandwidth`): every decoding step is memory bound and costs the bytes
it reads divided by the GPU's peak bandwidth.

* **Plain floor**: a plain step reads the weights (a mixture of experts: its routed experts) and the whole KV cache
  (a sliding layer: its window).
* **Level-1 step**: level 1's weights (``full``; ``int8``: the decoder layers' projections at one byte a parameter;
  ``int4``: at half a byte plus a bfloat16 scale and zero per 32; embeddings and LM head as they are) and
  ``retrieval_budget`` tokens of KV.
* **Verification**: ``gamma2 + 1`` tokens over the full cache, costed as one plain step (bandwidth bound).
* **A round**: ``gamma2`` level-1 steps and one verification yield
  :func:`~hf_triforce.bench.bandwidth.expected_tokens` ``(acceptance, gamma2)`` tokens; TriForce's ms a token is the
  round's cost over them (:func:`~hf_triforce.bench.bandwidth.modeled_speedup`). Level 0 (the default n-gram drafter,
  ~free) is not counted; token trees, re-selections and offloading are not modeled.

Two baselines, both printed and labelled:

* **the bandwidth floor**: the fastest any plain decoding of the model could be. The speedup over it is what
  TriForce could gain against an ideal decoder.
* **transformers' default** ``generate()`` (``DynamicCache``, sdpa), what a user runs without tuning. On a GPU it
  is host-bound, several times slower than its floor. Where the project has recorded that GPU class
  (:data:`RECORDED_STEPS`: H100, H200), each step's floor is scaled by what the records measured against their
  floors (the default path, TriForce's CUDA-graph level-1 step, its verification), and the speedup over the default
  path is modeled from those.

The acceptance is measured, on SmolLM2-135M at 7K tokens on a CPU (:data:`RECORDED_ACCEPTANCE`).

Example:
    >>> from transformers import LlamaConfig
    >>> llama31_8b = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256,
    ...                          max_position_embeddings=131072)
    >>> result = estimate(llama31_8b, context=65536, gpu="h100")
    >>> round(result.plain_floor_ms, 2), round(result.kinds["full"].speedup, 2), round(result.kinds["int4"].speedup, 2)
    (7.36, 1.0, 1.76)
    >>> round(result.default_generate.speedup, 1)  # over transformers' default generate(), as the H100 records ran
    3.8
    >>> result.recommended_expression()  # int4 models faster, but no GPU has timed it: a note, not the recommendation
    'TriForceConfig()'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import TriForceConfig
from ..errors import InvalidInputError
from ..kernels.int4_linear import GROUP_SIZE
from .bandwidth import (
    attended_kv_bytes,
    embedding_bytes,
    expected_tokens,
    layer_linear_bytes,
    modeled_speedup,
    read_weight_bytes,
    text_config,
    weight_bytes,
)
from .gpus import Gpu, resolve_gpu
from .memory import summaries_bytes, triforce_kv_bytes, view_bytes
from .options import DTYPE_ALIASES, DTYPE_BYTES

GPU_TIMED_WEIGHTS = ("full",)
"""Level-1 weight kinds whose step a GPU run has timed (the project's H100 and H200 records)."""
GPU_AUTO_WEIGHTS = "full"
"""What ``level1_weights="auto"`` runs on a CUDA device (``generation/plan.py``)."""

WEIGHT_KINDS = ("full", "int8", "int4")
BYTES_PER_PARAMETER = {"int8": 1.0, "int4": 0.5 + 2 * 2 / GROUP_SIZE}
"""Bytes a parameter of level 1's low-bit copy takes: int8 (a per-row scale is negligible); int4 half a byte plus a
bfloat16 scale and zero per :data:`~hf_triforce.kernels.int4_linear.GROUP_SIZE` inputs."""
GPU_REFUSED = {"int8": "refused on a GPU: the int8 kernel runs on the CPU only"}
"""Level-1 weight kinds the capability table (``generation/plan.py``) refuses on a CUDA device, and why."""
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class AcceptanceRange:
    """Per-token level-1 acceptance (accepted / (accepted + rejections) at level 2): the lowest and highest prompt of
    a record, and all its prompts pooled (``central``); ``source`` says where it was measured."""

    low: float
    central: float
    high: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SMOLLM2 = "SmolLM2-135M-Instruct, CPU, 7K-token prompts (prose, reference, code), T=0 and 0.6, a 512-token view"
# The records, under benchmarks/results/ (tests/unit/test_estimate.py re-derives every figure from its file): full
# and int4 from level1-int4-acceptance/level1-full.json and level1-int4.json, int8 from level1-weights-ab-7k.json.
RECORDED_ACCEPTANCE = {
    "full": AcceptanceRange(0.838, 0.888, 0.919, _SMOLLM2),
    "int8": AcceptanceRange(
        0.838, 0.888, 0.919,
        "full weights' figures: int8 matched full weights on one 7K prompt, 0.949 against 0.945 pooled",
    ),
    "int4": AcceptanceRange(0.843, 0.867, 0.899, _SMOLLM2),
}  # fmt: skip
"""Level-1 acceptance by weight kind, from the project's records. The GPU records ran random weights, whose
acceptance means nothing."""


@dataclass(frozen=True)
class StepRatios:
    """What the records of one GPU class measured against this model's floors, each as ``(lowest, median,
    highest)`` over their rows: transformers' default ``generate()`` a token (``plain``), TriForce's CUDA-graph
    level-1 step on full weights (``level1``) and its verification (``verification``)."""

    plain: tuple[float, float, float]
    level1: tuple[float, float, float]
    verification: tuple[float, float, float]
    source: str


_GPU_SHAPE = "Llama-3.1-8B shape, random weights, bf16, retrieval_budget 4096, 32K-128K tokens"
# benchmarks/results/h100-llama3.1-8b.json and h100-rowsum-llama3.1-8b.json (3 rows); h200-llama3.1-8b.json and
# h200-stacked-llama3.1-8b.json (6 rows). tests/unit/test_estimate.py re-derives the ratios from the files.
RECORDED_STEPS = {
    "H100": StepRatios((8.34, 10.94, 13.63), (2.48, 2.51, 2.54), (3.85, 4.32, 9.46), f"{_GPU_SHAPE}, 3 runs"),
    "H200": StepRatios((8.36, 11.89, 17.93), (3.00, 3.01, 3.05), (4.44, 6.47, 11.36), f"{_GPU_SHAPE}, 6 runs"),
}
"""Measured / floor ratios per GPU class, from the project's GPU records (the only GPUs it has run on)."""


@dataclass(frozen=True)
class DefaultGenerate:
    """transformers' default ``generate()`` on this GPU class as the records ran it, scaled to this model's floors.

    ``plain_ms_per_token``: its ms a token here (lowest, median and highest record ratio); ``triforce_ms_per_token``:
    TriForce's (full weights) with its steps as slow against their floors as recorded; ``speedup``
    (``speedup_range``): the median (the least and most favourable) of default over TriForce.
    """

    gpu: str
    measured_over_floor: StepRatios
    plain_ms_per_token: tuple[float, float, float]
    triforce_ms_per_token: float
    speedup: float
    speedup_range: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KindEstimate:
    """TriForce's modeled figures with one kind of level-1 weights; ``*_range``: at the lowest and highest acceptance.

    ``refused``: why the package refuses this kind on a GPU (``None``: it runs there).
    """

    weights: str
    level1_step_ms: float
    acceptance: AcceptanceRange
    ms_per_token: float
    ms_per_token_range: tuple[float, float]
    speedup: float
    speedup_range: tuple[float, float]
    copy_bytes: int
    refused: str | None = None


@dataclass(frozen=True)
class Estimate:
    """The answer of ``hf-triforce estimate``: memory in bytes, latencies in ms per token, all modeled."""

    model_type: str
    gpu: Gpu
    context: int
    dtype: str
    memory: dict[str, int]
    plain_floor_ms: float
    kinds: dict[str, KindEstimate]
    recommended: TriForceConfig
    notes: list[str] = field(default_factory=list)
    default_generate: DefaultGenerate | None = None

    def recommended_expression(self) -> str:
        """The recommended config as Python: ``TriForceConfig(...)`` with the fields that differ from the defaults."""
        default = TriForceConfig().to_dict()
        changed = [f"{k}={v!r}" for k, v in self.recommended.to_dict().items() if default[k] != v]
        return f"TriForceConfig({', '.join(changed)})"

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: snake_case keys; bytes and GB for memory, ms for latencies."""
        kinds = self.kinds.values()
        return {
            "model_type": self.model_type,
            "gpu": self.gpu.name,
            "bandwidth_bytes_per_s": self.gpu.bandwidth,
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "context": self.context,
            "dtype": self.dtype,
            "memory": {**self.memory, **{k.replace("_bytes", "_gb"): v / 1e9 for k, v in self.memory.items()}},
            "level1_copy_bytes": {k.weights: k.copy_bytes for k in kinds},
            "plain_floor_ms_per_token": self.plain_floor_ms,
            "verification_ms": self.plain_floor_ms,
            "level1_step_ms": {k.weights: k.level1_step_ms for k in kinds},
            "triforce_ms_per_token": {k.weights: k.ms_per_token for k in kinds},
            "triforce_ms_per_token_range": {k.weights: list(k.ms_per_token_range) for k in kinds},
            "speedup": {k.weights: k.speedup for k in kinds},
            "speedup_range": {k.weights: list(k.speedup_range) for k in kinds},
            "speedup_baseline": "the plain floor (the fastest plain decoding could be)",
            "default_generate": None if self.default_generate is None else self.default_generate.to_dict(),
            "acceptance": {k.weights: k.acceptance.to_dict() for k in kinds},
            "refused_on_gpu": {k.weights: k.refused for k in kinds},
            "recommended_config": self.recommended.to_dict(),
            "recommended_config_python": self.recommended_expression(),
            "modeled": MODELED,
            "notes": list(self.notes),
        }


MODELED = (
    "bandwidth floors at the GPU's peak: a plain step reads the weights and the KV cache; a level-1 step level 1's "
    "weights and retrieval_budget tokens of KV; a verification costs a plain step; a round of gamma2 level-1 steps and "
    "one verification yields expected_tokens(acceptance, gamma2). Level 0 (n-gram, ~free) not counted; token trees, "
    "re-selections, offloading and compute not modeled."
)


def dtype_bytes(dtype: str) -> tuple[str, int]:
    """``(canonical name, bytes)`` of a weight/KV dtype name (``bfloat16``, ``bf16``, ``float16``, ``fp32``, ...).

    Example:
        >>> dtype_bytes("bf16"), dtype_bytes("float32")
        (('bfloat16', 2), ('float32', 4))
    """
    name = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPE_BYTES:
        raise InvalidInputError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}.")
    return name, DTYPE_BYTES[name]


def estimate_inputs(context: str | int, gpu: str, dtype: str) -> tuple[int, Gpu, str]:
    """``--context`` (``65536``, ``64k``), ``--gpu`` and ``--dtype`` checked: ``(tokens, Gpu, dtype name)``.

    Raises:
        InvalidInputError: a context that is not a positive token count, an unknown GPU or dtype.

    Example:
        >>> tokens, gpu, dtype = estimate_inputs("64k", "h200", "bf16")
        >>> tokens, gpu.name, dtype
        (65536, 'H200', 'bfloat16')
    """
    text = str(context).strip()
    scale = 1024 if text[-1:] in ("k", "K") else 1
    try:
        tokens = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise InvalidInputError(
            f"--context {context!r}: give the tokens in the cache while decoding (prompt + answer), e.g. 65536 or 64k."
        )
    return tokens, resolve_gpu(gpu), dtype_bytes(dtype)[0]


def level1_weight_bytes(config, dtype_bytes: int, weights: str) -> int:
    """Bytes of weights a level-1 step reads with ``weights`` (``full``, ``int8``, ``int4``): the decoder layers'
    projections (a mixture of experts: its routed experts) in that kind, the embeddings and LM head as they are.

    Example:
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256)  # Llama-3.1-8B
        >>> [round(level1_weight_bytes(cfg, 2, kind) / 1e9, 2) for kind in WEIGHT_KINDS]  # GB
        [16.06, 9.08, 6.46]
    """
    if weights == "full":
        return read_weight_bytes(config, dtype_bytes)
    parameters = layer_linear_bytes(config, 1, active=True)
    return round(parameters * BYTES_PER_PARAMETER[weights]) + embedding_bytes(config, dtype_bytes)


def level1_copy_bytes(config, weights: str) -> int:
    """Device bytes of level 1's low-bit copy, made once beside the target's weights (``0`` for ``full``).

    Example:
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256)  # Llama-3.1-8B
        >>> round(level1_copy_bytes(cfg, "int4") / 1e9, 2)
        4.36
    """
    if weights == "full":
        return 0
    return round(layer_linear_bytes(config, 1) * BYTES_PER_PARAMETER[weights])


def memory_terms(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig) -> dict[str, int]:
    """Device memory by term, in bytes: the weights, plain ``generate()``'s KV cache, and what TriForce adds to it
    (its full cache reserves every full layer's ``max_length`` and a sliding layer's window and one round; the chunk
    summaries of the full layers; level 1's retrieval view). Level 1's low-bit copy is per kind
    (:func:`level1_copy_bytes`); activations are not counted here (:mod:`~hf_triforce.bench.memory` estimates the
    peak with them).

    Example:
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256)  # Llama-3.1-8B
        >>> terms = memory_terms(cfg, 65536, 2, TriForceConfig())
        >>> round(terms["weights_bytes"] / 1e9, 1), round(terms["plain_kv_bytes"] / 1e9, 1)
        (16.1, 8.6)
    """
    tc = triforce_config
    plain_kv = attended_kv_bytes(config, context, dtype_bytes)
    cache_growth = triforce_kv_bytes(config, context, dtype_bytes, tc) - plain_kv
    summaries = summaries_bytes(config, context, dtype_bytes, tc)
    views = view_bytes(config, context, dtype_bytes, tc)
    weights = weight_bytes(config, dtype_bytes)
    return {
        "weights_bytes": weights,
        "plain_kv_bytes": plain_kv,
        "plain_total_bytes": weights + plain_kv,
        "triforce_cache_growth_bytes": cache_growth,
        "triforce_summaries_bytes": summaries,
        "triforce_views_bytes": views,
        "triforce_extra_bytes": cache_growth + summaries + views,
    }


def plain_floor_ms(config, context: int, dtype_bytes: int, gpu: Gpu) -> float:
    """Milliseconds a plain step takes at least: the weights it reads and the KV cache, at the GPU's peak bandwidth.

    Example:
        >>> from transformers import LlamaConfig
        >>> round(plain_floor_ms(LlamaConfig(), 131072, 2, resolve_gpu("h100")), 1)  # Llama-2-7B's shape at 128K
        24.5
    """
    read = read_weight_bytes(config, dtype_bytes) + attended_kv_bytes(config, context, dtype_bytes)
    return 1e3 * read / gpu.bandwidth


def kind_estimate(
    config, context: int, dtype_bytes: int, gpu: Gpu, weights: str, triforce_config: TriForceConfig
) -> KindEstimate:
    """TriForce's modeled ms a token and speedup over the plain floor with level-1 ``weights``.

    Example:
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256)  # Llama-3.1-8B
        >>> kind = kind_estimate(cfg, 131072, 2, resolve_gpu("h100"), "full", TriForceConfig())
        >>> round(kind.level1_step_ms, 2), round(kind.speedup, 2), [round(s, 2) for s in kind.speedup_range]
        (4.95, 1.26, [1.1, 1.38])
    """
    plain = plain_floor_ms(config, context, dtype_bytes, gpu)
    view = min(triforce_config.for_context(context).retrieval_budget, context)
    level1_bytes = level1_weight_bytes(config, dtype_bytes, weights) + attended_kv_bytes(config, view, dtype_bytes)
    level1 = 1e3 * level1_bytes / gpu.bandwidth
    acceptance = RECORDED_ACCEPTANCE[weights]

    def speedup(rate: float) -> float:
        return modeled_speedup(plain, level1, plain, rate, triforce_config.gamma2)

    low, central, high = (speedup(a) for a in (acceptance.low, acceptance.central, acceptance.high))
    return KindEstimate(
        weights=weights,
        level1_step_ms=level1,
        acceptance=acceptance,
        ms_per_token=plain / central,
        ms_per_token_range=(plain / high, plain / low),
        speedup=central,
        speedup_range=(low, high),
        copy_bytes=level1_copy_bytes(config, weights),
        refused=GPU_REFUSED.get(weights),
    )


def estimate(
    config, context: int, gpu: str | Gpu, dtype: str = "bfloat16", triforce_config: TriForceConfig | None = None
) -> Estimate:
    """Memory, the plain floor, TriForce's modeled ms a token per level-1 weight kind, and a recommended config.

    Args:
        config: a transformers config (a multimodal one's text config is read), e.g. from
            :func:`~hf_triforce.bench.local_config.load_local_config`.
        context: tokens in the cache while decoding (prompt + answer).
        gpu: a :class:`~hf_triforce.bench.gpus.Gpu` or a ``--gpu`` value (``h100``, ..., or GB/s).
        dtype: the weights' and KV cache's dtype.
        triforce_config: the settings modeled (``retrieval_budget``, ``gamma2``); default ``TriForceConfig()``.

    Raises:
        InvalidInputError: an unknown GPU or dtype, ``context`` < 1, or a config without a decoder's shape.
    """
    gpu = gpu if isinstance(gpu, Gpu) else resolve_gpu(gpu)
    dtype, size = dtype_bytes(dtype)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InvalidInputError(f"context={context!r}: give the tokens in the cache while decoding, e.g. 65536.")
    text = _checked_text_config(config)
    tc = triforce_config or TriForceConfig()
    memory = memory_terms(text, context, size, tc)
    kinds = {kind: kind_estimate(text, context, size, gpu, kind, tc) for kind in WEIGHT_KINDS}
    plain = plain_floor_ms(text, context, size, gpu)
    recommended, notes = _recommendation(text, context, gpu, memory, kinds, tc)
    model_type = getattr(config, "model_type", "") or "unknown"
    default = default_generate(plain, kinds["full"], gpu, tc.gamma2)
    return Estimate(model_type, gpu, context, dtype, memory, plain, kinds, recommended, notes, default)


def default_generate(plain_floor: float, full: KindEstimate, gpu: Gpu, gamma2: int) -> DefaultGenerate | None:
    """transformers' default ``generate()`` and TriForce (full weights) with each step as much slower than its floor
    as the records of ``gpu``'s class measured (:data:`RECORDED_STEPS`); ``None`` for a GPU the project has no
    record of.

    Example:
        >>> full = KindEstimate("full", 4.95, RECORDED_ACCEPTANCE["full"], 7.36, (6.7, 8.5), 1.0, (0.9, 1.1), 0)
        >>> result = default_generate(7.36, full, resolve_gpu("h100"), gamma2=6)
        >>> [round(ms) for ms in result.plain_ms_per_token], round(result.triforce_ms_per_token, 1)
        ([61, 81, 100], 21.1)
        >>> round(result.speedup, 1)
        3.8
        >>> default_generate(7.36, full, resolve_gpu("a100"), gamma2=6) is None
        True
    """
    ratios = RECORDED_STEPS.get(gpu.name)
    if ratios is None:
        return None
    acceptance = full.acceptance

    def triforce_ms(i: int, rate: float) -> float:  # i: 0 lowest, 1 median, 2 highest ratio of each step
        round_ms = gamma2 * full.level1_step_ms * ratios.level1[i] + plain_floor * ratios.verification[i]
        return round_ms / expected_tokens(rate, gamma2)

    plain = tuple(plain_floor * r for r in ratios.plain)
    central = triforce_ms(1, acceptance.central)
    worst = plain[0] / triforce_ms(2, acceptance.low)  # the fastest default against TriForce's slowest steps
    best = plain[2] / triforce_ms(0, acceptance.high)
    return DefaultGenerate(gpu.name, ratios, plain, central, plain[1] / central, (worst, best))


def _checked_text_config(config):
    text = text_config(config)
    missing = [name for name in REQUIRED_FIELDS if not getattr(text, name, None)]
    if missing:
        raise InvalidInputError(f"the model's config has no {', '.join(missing)}: is it a decoder-only LM's config?")
    return text


def _recommendation(
    config, context: int, gpu: Gpu, memory: dict[str, int], kinds: dict[str, KindEstimate], tc: TriForceConfig
) -> tuple[TriForceConfig, list[str]]:
    """``tc`` with the fastest level-1 weights a GPU has run (left ``"auto"`` where that is what ``"auto"`` runs on a
    GPU) and ``offload_kv`` when plain decoding does not fit.

    A weight kind no GPU has timed is never recommended (a note says what it models instead)."""
    served = [k for k in kinds.values() if k.refused is None]
    fastest = min((k for k in served if k.weights in GPU_TIMED_WEIGHTS), key=lambda k: k.ms_per_token)
    untimed = min(served, key=lambda k: k.ms_per_token)
    notes = []
    needed = memory["plain_total_bytes"] + memory["triforce_extra_bytes"] + fastest.copy_bytes
    offload = gpu.memory_bytes is not None and memory["plain_total_bytes"] > gpu.memory_bytes
    if gpu.memory_bytes is None:
        notes.append("GPU memory unknown (a bandwidth was given): offload_kv not decided, left False.")
    elif offload:
        notes.append(
            f"weights + plain KV ({memory['plain_total_bytes'] / 1e9:.1f} GB) exceed the GPU's "
            f"{gpu.memory_bytes / 1e9:.0f} GB: offload_kv=True (tested on the CPU only; its PCIe transfers are not "
            "modeled; gamma2 12-16 suits it: the documentation's 'Long context on a small GPU')."
        )
    elif needed > gpu.memory_bytes:
        notes.append(
            f"with TriForce's extra memory ({needed / 1e9:.1f} GB without activations) the GPU's "
            f"{gpu.memory_bytes / 1e9:.0f} GB is tight: consider offload_kv=True or prefill_chunk_size."
        )
    if fastest.speedup < 1.1:
        notes.append(
            f"level1_weights={fastest.weights!r} models {fastest.speedup:.2f}x the plain floor: expect little or "
            "nothing over a plain decoding that reaches its floor (the adaptive schedule takes plain steps where "
            "speculation loses); against transformers' default generate() see 'vs default'."
        )
    if untimed.ms_per_token < fastest.ms_per_token:
        notes.append(
            f"level1_weights={untimed.weights!r} models {untimed.speedup:.2f}x, but no GPU has timed its step yet: "
            "worth trying, not recommended."
        )
    limit = getattr(config, "max_position_embeddings", None)
    if limit and context > limit:
        notes.append(f"context {context} exceeds the config's max_position_embeddings ({limit}).")
    notes.append(
        "the acceptance was measured at 7K tokens with a 512-token view (1/14 of the context), on a 135M model; the "
        "TriForce paper reports 0.91-0.96 for a 4K view of 120K tokens (Llama-2-7B-128K)."
    )
    weights = tc.level1_weights if fastest.weights == GPU_AUTO_WEIGHTS else fastest.weights  # "auto" runs it
    return TriForceConfig(**{**tc.to_dict(), "level1_weights": weights, "offload_kv": offload}), notes


def format_estimate(result: Estimate, model: str) -> str:
    """The human form: memory, the plain floor, one row per level-1 weight kind against the floor, transformers'
    default ``generate()`` as the records ran it on this GPU class, the recommended config."""
    m, gpu, kinds = {k: v / 1e9 for k, v in result.memory.items()}, result.gpu, result.kinds
    of_gpu = "" if gpu.memory_bytes is None else f" of the GPU's {gpu.memory_bytes / 1e9:.0f}"
    lines = [
        f"{model} ({result.model_type}), {result.context} tokens, {result.dtype}, on {gpu.name} "
        f"({gpu.bandwidth / 1e9:.0f} GB/s). Every figure is modeled, not measured.",
        "",
        f"memory (GB)  weights {m['weights_bytes']:.1f} + plain KV cache {m['plain_kv_bytes']:.1f} = "
        f"{m['plain_total_bytes']:.1f}{of_gpu}",
        f"             TriForce adds {m['triforce_extra_bytes']:.2f} "
        f"(full cache +{m['triforce_cache_growth_bytes']:.2f}, "
        f"chunk summaries {m['triforce_summaries_bytes']:.2f}, views {m['triforce_views_bytes']:.2f}); level 1's "
        f"int4 copy +{kinds['int4'].copy_bytes / 1e9:.1f}, int8 copy +{kinds['int8'].copy_bytes / 1e9:.1f}",
        f"plain floor  {result.plain_floor_ms:.2f} ms/token (weights + KV cache read once at peak bandwidth: the "
        "fastest plain decoding could be)",
        "",
        f"{'level 1':<9}{'step ms':>7}   {'TriForce ms/token':<20}{'vs plain floor':<19}{'acceptance':<20}",
    ]
    for kind in kinds.values():
        (fast, slow), (low, high), a = kind.ms_per_token_range, kind.speedup_range, kind.acceptance
        row = (
            f"{kind.weights:<9}{kind.level1_step_ms:>7.2f}   {kind.ms_per_token:>5.2f} ({fast:.2f}-{slow:.2f})   "
            f"{kind.speedup:>5.2f}x ({low:.2f}-{high:.2f})  {a.central:.3f} ({a.low:.3f}-{a.high:.3f})"
        )
        lines.append(row + (f"  {kind.refused}" if kind.refused else ""))
    lines += ["", *_default_lines(result.default_generate)]
    lines += ["", "acceptance: per level-1 token, all prompts pooled (lowest-highest prompt), the project's records"]
    lines += [f"  {kind.weights}: {kind.acceptance.source}" for kind in kinds.values()]
    lines += [f"modeled: {MODELED}", *[f"note: {note}" for note in result.notes], ""]
    lines.append(f"recommended: {result.recommended_expression()}")
    return "\n".join(lines)


def _default_lines(default: DefaultGenerate | None) -> list[str]:
    """The second baseline, labelled: transformers' default ``generate()`` as recorded on this GPU class."""
    if default is None:
        return [
            "vs default   transformers' default generate(): no record of this GPU class (the project's GPU runs: "
            "H100, H200), so only the floor comparison above."
        ]
    (lo, mid, hi), r = default.plain_ms_per_token, default.measured_over_floor
    worst, best = default.speedup_range
    return [
        f"vs default   transformers' default generate() (DynamicCache, sdpa) on {default.gpu}, as the project's "
        f"records ran it ({r.source}):",
        f"             host-bound at {r.plain[0]:.1f}-{r.plain[2]:.1f}x its floor: ~{mid:.0f} ms/token here "
        f"({lo:.0f}-{hi:.0f})",
        f"             TriForce with its steps as recorded (level 1 {r.level1[0]:.2f}-{r.level1[2]:.2f}x, a "
        f"verification {r.verification[0]:.1f}-{r.verification[2]:.1f}x their floors; full weights):",
        f"             ~{default.triforce_ms_per_token:.1f} ms/token, {default.speedup:.1f}x ({worst:.1f}-{best:.1f}x) "
        "over default generate()",
    ]
