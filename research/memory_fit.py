"""Whether the benchmark's plain and TriForce ``generate()`` fit a GPU, checked before anything is loaded.

``python -m research.lab_bench --preset llama2-7b --device cuda --dtype bfloat16 --prompt-tokens 120000`` builds a
random-weights model and runs plain ``generate()`` and then TriForce ``generate()`` on the same prompt in one
process, so the larger of the two peaks (:mod:`hf_triforce.bench.memory`), plus a safety margin,
must fit in the GPU. :func:`check_fits` says so (or raises :class:`MemoryBudgetError` saying what to change)
and :func:`longest_context` finds the longest context that fits.

Example:
    >>> from research.shapes import preset_config
    >>> from hf_triforce.config import TriForceConfig
    >>> cfg = preset_config("llama3.1-8b", context=131072)
    >>> longest_context(cfg, 2, TriForceConfig(), H100_BYTES) >= 131072
    True
"""

from __future__ import annotations

import dataclasses
import logging
import math

from hf_triforce.bench.bandwidth import head_dim, kv_bytes_per_token, kv_heads, text_config
from hf_triforce.bench.memory import static_view, view_bytes
from hf_triforce.config import TriForceConfig
from hf_triforce.errors import TriForceError

from .memory_peak import (
    GIB,
    MemoryEstimate,
    batch_estimate,
    draft_weight_bytes,
    plain_generate_estimate,
    triforce_generate_estimate,
)

logger = logging.getLogger(__name__)

H100_BYTES = int(79.1 * GIB)  # about what an 80 GB H100 reports (torch.cuda.get_device_properties().total_memory)
# Safety margin: required = estimate x (1 + MARGIN_FRACTION) + MARGIN_BYTES. The fraction covers the caching
# allocator's rounding and fragmentation (DynamicCache reallocates every layer's keys and values every step);
# the fixed part covers what the estimate leaves out: the CUDA context, cuBLAS/cuDNN workspaces, kernel scratch.
MARGIN_FRACTION = 0.05
MARGIN_BYTES = GIB
PREFILL_CHUNKS = (16384, 8192, 4096, 2048, 1024, 512, 256)  # --prefill-chunk-size values tried for a suggestion
BOTH_RUNS = " (for both runs: TriForceConfig.prefill_chunk_size; transformers' prefill_chunk_size for plain generate())"


class MemoryBudgetError(TriForceError):
    """The requested sizes do not fit in the device's memory; the message says what does not fit and what to do."""


def required_bytes(
    estimate: MemoryEstimate, margin_fraction: float = MARGIN_FRACTION, margin_bytes: int = MARGIN_BYTES
) -> int:
    """Device bytes needed for ``estimate`` with the safety margin: ``total x (1 + fraction) + bytes``.

    Example:
        >>> required_bytes(MemoryEstimate(weights=100 * GIB, kv=0, prefill=0, decode=0)) / GIB
        106.0
    """
    return math.ceil(estimate.total * (1 + margin_fraction)) + margin_bytes


def _estimates(config, context, dtype_bytes, tc, draft_config, plain_prefill_chunk) -> list[MemoryEstimate]:
    """``[plain, triforce]``; the draft model's weights, and a static TriForce view kept from the previous
    row's call, stay allocated during the plain run too."""
    plain = plain_generate_estimate(config, context, dtype_bytes, plain_prefill_chunk)
    if draft_config is not None:
        plain = dataclasses.replace(plain, draft=draft_weight_bytes(draft_config, text_config(config), dtype_bytes))
    if static_view(tc):  # the static level-1 view stays on the model between calls (static_steps.RunnerSlot)
        plain = dataclasses.replace(plain, kept_view=view_bytes(config, context, dtype_bytes, tc))
    return [plain, triforce_generate_estimate(config, context, dtype_bytes, tc, draft_config)]


def _chunked(tc: TriForceConfig, chunk: int | None) -> TriForceConfig:
    return dataclasses.replace(tc, prefill_chunk_size=chunk)


def check_fits(
    config,
    context: int,
    dtype_bytes: int,
    triforce_config: TriForceConfig,
    available_bytes: int,
    draft_config=None,
    *,
    plain_prefill_chunk: int | None = None,
    margin_fraction: float = MARGIN_FRACTION,
    margin_bytes: int = MARGIN_BYTES,
) -> MemoryEstimate:
    """Check that plain and TriForce ``generate()`` over ``context`` tokens fit in ``available_bytes``.

    The larger of the two peaks (:func:`plain_generate_estimate`, :func:`triforce_generate_estimate`), grown by
    the safety margin (:func:`required_bytes`: ``margin_fraction`` for allocator rounding and fragmentation,
    ``margin_bytes`` for the CUDA context and workspaces) must not exceed ``available_bytes``.

    Args:
        config: the target's transformers config (e.g. :func:`research.shapes.preset_config`).
        context: prompt + new tokens.
        dtype_bytes: bytes per weight/activation element (2 for bfloat16).
        triforce_config: the TriForce configuration (its ``prefill_chunk_size`` is TriForce's prefill).
        available_bytes: device memory (e.g. ``torch.cuda.get_device_properties(0).total_memory``).
        draft_config: the level-0 draft model's config, when one is loaded.
        plain_prefill_chunk: the ``prefill_chunk_size`` plain ``generate()`` is given, if any.

    Returns:
        The larger estimate.

    Raises:
        MemoryBudgetError: it does not fit; the message names the shape, the estimate, the available memory, the
            longest context that fits and, when the prefill is what overflows, a ``--prefill-chunk-size`` that fits.

    Example:
        >>> from research.shapes import preset_config
        >>> cfg = preset_config("llama2-7b", 131072)
        >>> check_fits(cfg, 32768, 2, TriForceConfig(), H100_BYTES).total < H100_BYTES
        True
        >>> check_fits(cfg, 131072, 2, TriForceConfig(), H100_BYTES)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        research.memory_fit.MemoryBudgetError: ...The longest context that fits is 102400 tokens...
    """
    margins = {"margin_fraction": margin_fraction, "margin_bytes": margin_bytes}
    estimates = _estimates(config, context, dtype_bytes, triforce_config, draft_config, plain_prefill_chunk)
    worst = max(estimates, key=lambda e: e.total)
    logger.info(
        "memory at %d tokens: plain generate() %.1f GiB, TriForce %.1f GiB before the margin; %.1f GiB available",
        context, estimates[0].total / GIB, estimates[1].total / GIB, available_bytes / GIB,
    )  # fmt: skip
    if required_bytes(worst, **margins) <= available_bytes:
        return worst
    args = (config, context, dtype_bytes, triforce_config, available_bytes, draft_config)
    raise MemoryBudgetError(_message(*args, estimates, plain_prefill_chunk, margins))


def _fits(config, context, dtype_bytes, tc, available_bytes, draft_config, plain_prefill_chunk, margins) -> bool:
    estimates = _estimates(config, context, dtype_bytes, tc, draft_config, plain_prefill_chunk)
    return all(required_bytes(e, **margins) <= available_bytes for e in estimates)


def longest_context(
    config,
    dtype_bytes: int,
    triforce_config: TriForceConfig,
    available_bytes: int,
    multiple: int = 1024,
    draft_config=None,
    *,
    plain_prefill_chunk: int | None = None,
    margin_fraction: float = MARGIN_FRACTION,
    margin_bytes: int = MARGIN_BYTES,
) -> int:
    """The longest context (a multiple of ``multiple``; 0 if none) for which :func:`check_fits` passes.

    A binary search: every term grows with the context, and a context whose KV cache alone exceeds
    ``available_bytes`` cannot fit. Same arguments as :func:`check_fits`.

    Example:
        >>> from research.shapes import preset_config
        >>> longest_context(preset_config("llama2-7b", 131072), 2, TriForceConfig(), H100_BYTES)
        102400
    """
    margins = {"margin_fraction": margin_fraction, "margin_bytes": margin_bytes}
    rest = (triforce_config, available_bytes, draft_config, plain_prefill_chunk, margins)
    per_multiple = multiple * kv_bytes_per_token(text_config(config), dtype_bytes)
    lo, hi = 0, available_bytes // per_multiple + 1  # hi x multiple tokens of KV alone exceed the memory
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(config, mid * multiple, dtype_bytes, *rest) else (lo, mid)
    return lo * multiple


def suggest_prefill_chunk(
    config, context, dtype_bytes, triforce_config, available_bytes, draft_config=None, margins=None
) -> int | None:
    """The largest of :data:`PREFILL_CHUNKS` with which both runs fit (plain ``generate()`` given it too), or None.

    Example:
        >>> from research.shapes import preset_config
        >>> suggest_prefill_chunk(preset_config("llama3.1-8b", 131072), 131072, 2, TriForceConfig(), 40 * GIB)
        4096
    """
    margins = margins or {}
    for chunk in PREFILL_CHUNKS:
        tc = _chunked(triforce_config, chunk)
        if _fits(config, context, dtype_bytes, tc, available_bytes, draft_config, chunk, margins):
            return chunk
    return None


def describe_shape(config) -> str:
    """The numbers of a Llama-like shape, e.g. ``"32 layers, hidden 4096, 32 heads / 8 KV heads x 128, ..."``.

    Example:
        >>> from research.shapes import preset_config
        >>> describe_shape(preset_config("llama3.1-8b", 4096))
        '32 layers, hidden 4096, 32 heads / 8 KV heads x 128, intermediate 14336, vocab 128256'
    """
    c = text_config(config)
    return (
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads / {kv_heads(c)} KV "
        f"heads x {head_dim(c)}, intermediate {c.intermediate_size}, vocab {c.vocab_size}"
    )


def _message(config, context, dtype_bytes, tc, available, draft_config, estimates, plain_chunk, margins) -> str:
    """What does not fit, by how much, the longest context that fits and, if it helps, a prefill chunk size."""
    plain, triforce = estimates
    worst, name = (plain, "plain generate()") if plain.total >= triforce.total else (triforce, "TriForce generate()")
    longest = longest_context(
        config, dtype_bytes, tc, available, draft_config=draft_config, plain_prefill_chunk=plain_chunk, **margins
    )
    lines = [
        f"A {context}-token context (prompt + new tokens) does not fit in {available / GIB:.1f} GiB of device memory "
        f"for the shape {describe_shape(config)} in {dtype_bytes}-byte elements: {name} needs about "
        f"{worst.total / GIB:.1f} GiB ({worst.describe()}; plain generate() {plain.total / GIB:.1f} GiB, TriForce "
        f"{triforce.total / GIB:.1f} GiB), {required_bytes(worst, **margins) / GIB:.1f} GiB with the safety margin "
        f"({margins['margin_fraction']:.0%} + {margins['margin_bytes'] / GIB:.1f} GiB).",
        _longest_hint(longest, worst),
        _prefill_hint(config, context, dtype_bytes, tc, available, draft_config, estimates, margins),
    ]
    return " ".join(line for line in lines if line)


def _longest_hint(longest: int, worst: MemoryEstimate) -> str:
    if longest == 0:
        return f"No context fits (the weights alone take {worst.weights / GIB:.1f} GiB): use a smaller shape or dtype."
    return (
        f"The longest context that fits is {longest} tokens: lower --prompt-tokens (prompt + new tokens <= {longest})."
    )


def _prefill_hint(config, context, dtype_bytes, tc, available, draft_config, estimates, margins) -> str:
    """When the prefill sets the peak: a ``--prefill-chunk-size`` that fits, else the longest context chunked."""
    worst = max(estimates, key=lambda e: e.total)
    if not worst.prefill_bound:
        return ""
    what = f"The prefill sets the peak ({worst.prefill / GIB:.1f} GiB of transient activations and masks)"
    chunk = suggest_prefill_chunk(config, context, dtype_bytes, tc, available, draft_config, margins)
    if chunk is not None:
        return f"{what}: --prefill-chunk-size {chunk} makes it fit{BOTH_RUNS}."
    longest, chunk = max(
        (longest_context(config, dtype_bytes, _chunked(tc, c), available, draft_config=draft_config,
                         plain_prefill_chunk=c, **margins), c)
        for c in PREFILL_CHUNKS
    )  # fmt: skip
    return f"{what}; with --prefill-chunk-size {chunk}{BOTH_RUNS} the longest context that fits is {longest} tokens."


def largest_batch(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig, available_bytes: int) -> int:
    """The most rows of ``context`` tokens each for which plain and TriForce ``generate()`` fit (0: not even one).

    Example:
        >>> from research.shapes import preset_config
        >>> largest_batch(preset_config("llama3.1-8b", 32768), 32768, 2, TriForceConfig(), H100_BYTES)
        7
    """
    estimates = _estimates(config, context, dtype_bytes, triforce_config, None, None)
    batch = 0
    while all(required_bytes(batch_estimate(e, batch + 1)) <= available_bytes for e in estimates):
        batch += 1
    return batch


def check_batch_fits(
    config, batch: int, context: int, dtype_bytes: int, triforce_config: TriForceConfig, available_bytes: int
) -> None:
    """Raise :class:`MemoryBudgetError` unless ``batch`` rows of ``context`` tokens fit, naming the largest batch
    that does.

    Example:
        >>> from research.shapes import preset_config
        >>> check_batch_fits(preset_config("llama3.1-8b", 32768), 32, 32768, 2, TriForceConfig(), H100_BYTES)
        Traceback (most recent call last):
            ...
        research.memory_fit.MemoryBudgetError: A batch of 32 rows of 32768 tokens ...
    """
    fits = largest_batch(config, context, dtype_bytes, triforce_config, available_bytes)
    if batch > fits:
        raise MemoryBudgetError(
            f"A batch of {batch} rows of {context} tokens does not fit in {available_bytes / GIB:.1f} GiB for the "
            f"shape {describe_shape(config)}: the largest batch that fits is {fits} rows"
            + (" (lower --batch-size)." if fits else "; not even one row fits: lower --prompt-tokens.")
        )
