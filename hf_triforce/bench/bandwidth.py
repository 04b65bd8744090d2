"""The bandwidth model of decoding (DESIGN.md section 5) and the speedup it predicts for TriForce.

A decoding step is memory bound: it reads every weight once and the keys/values it attends to once.
Its floor on a device of bandwidth ``B`` bytes/s is ``(weight bytes + attended tokens x KV bytes per
token) / B``. For Llama-2-7B (MHA, fp16) that is 0.5 MiB of KV per token; at 128K a full step reads
~13.5 GB of weights plus ~64 GB of KV.

Example:
    >>> from hf_triforce.bench.shapes import preset_config
    >>> cfg = preset_config("llama2-7b", context=131072)
    >>> kv_bytes_per_token(cfg, 2) / 2**20
    0.5
    >>> step_bytes = weight_bytes(cfg, 2) + 131072 * kv_bytes_per_token(cfg, 2)  # a step at 128K
    >>> round(1e3 * step_bytes / PEAK_BANDWIDTH["H100"], 1)  # ms
    24.5
"""

from __future__ import annotations

from .shapes import head_dim, kv_heads

# Peak HBM bandwidth in bytes/s, matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "RTX 4090": 1.008e12}


def device_bandwidth(device_name: str | None) -> float | None:
    """Peak bandwidth (bytes/s) of a known GPU by name, else ``None`` (no floor is reported)."""
    for key, value in PEAK_BANDWIDTH.items():
        if device_name and key.lower() in device_name.lower():
            return value
    return None


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """Key + value bytes one token adds to the cache: ``2 x layers x kv_heads x head_dim x dtype_bytes``."""
    return 2 * config.num_hidden_layers * kv_heads(config) * head_dim(config) * dtype_bytes


def weight_bytes(config, dtype_bytes: int) -> int:
    """Bytes of a Llama-architecture model's weights (embedding + layers + norm + untied lm_head)."""
    h, d = config.hidden_size, head_dim(config)
    attention = h * d * (2 * config.num_attention_heads + 2 * kv_heads(config))
    layer = attention + 3 * h * config.intermediate_size + 2 * h
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return dtype_bytes * (config.num_hidden_layers * layer + embeddings + h)


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Tokens produced per verification of ``gamma`` drafts, each accepted with probability ``acceptance``.

    ``(1 - a^(gamma + 1)) / (1 - a)``: the accepted prefix plus the token the verifier adds.

    Example:
        >>> expected_tokens(0.0, 6), expected_tokens(1.0, 6)
        (1.0, 7.0)
    """
    if acceptance >= 1.0:
        return float(gamma + 1)
    return (1.0 - acceptance ** (gamma + 1)) / (1.0 - acceptance)


def modeled_speedup(
    full_step_ms: float,
    level1_step_ms: float,
    verify_ms: float,
    level1_acceptance: float,
    gamma2: int,
    level0_step_ms: float = 0.0,
    level0_acceptance: float | None = None,
    gamma1: int = 0,
) -> float:
    """Speedup over plain decoding predicted from per-level latencies and acceptance rates.

    A round drafts ``gamma2`` tokens at level 1 and verifies them in one full-cache forward of
    ``verify_ms``, producing :func:`expected_tokens` ``(level1_acceptance, gamma2)`` tokens. Without
    level 0 each level-1 token costs one ``level1_step_ms`` step; with level 0 a level-1 step verifies
    ``gamma1`` level-0 drafts (``gamma1 x level0_step_ms``) and yields
    ``expected_tokens(level0_acceptance, gamma1)`` tokens. Plain decoding costs ``full_step_ms`` a token.

    Example:
        >>> round(modeled_speedup(56.0, 14.0, 60.0, 0.92, gamma2=6), 2)  # the paper's 7B per-step figures
        2.15
    """
    per_level1_token = level1_step_ms
    if level0_acceptance is not None and gamma1 > 0:
        per_level1_token = (gamma1 * level0_step_ms + level1_step_ms) / expected_tokens(level0_acceptance, gamma1)
    round_ms = gamma2 * per_level1_token + verify_ms
    return expected_tokens(level1_acceptance, gamma2) * full_step_ms / round_ms


def modeled_batch_speedup(
    config, dtype_bytes: int, batch: int, context: int, budget: int, acceptance: float, gamma2: int
) -> dict[str, float]:
    """Bandwidth-model figures of a batch: every step reads the weights once and each row's KV.

    A plain step reads ``weights + batch x context`` tokens of KV; a level-1 step ``weights + batch x budget``; a
    verification of ``gamma2 + 1`` tokens per row reads what a plain step reads (bandwidth bound: its extra
    compute is assumed hidden). A round of ``gamma2`` level-1 steps and one verification yields
    :func:`expected_tokens` per row. The KV share of a step grows with the batch, so speculation over a sparse
    view pays more with larger batches (MagicDec's observation).

    Returns:
        ``{"plain_bytes", "level1_bytes", "kv_share", "speedup"}`` (``kv_share``: KV bytes / all bytes of a
        plain step).

    Example:
        >>> from hf_triforce.bench.shapes import preset_config
        >>> figures = modeled_batch_speedup(preset_config("llama3.1-8b", 1), 2, 8, 32768, 4096, 0.9, 6)
        >>> round(figures["speedup"], 2), round(figures["kv_share"], 2)
        (1.52, 0.68)
    """
    kv = kv_bytes_per_token(config, dtype_bytes)
    weights = weight_bytes(config, dtype_bytes)
    plain = weights + batch * context * kv
    level1 = weights + batch * min(budget, context) * kv
    speedup = expected_tokens(acceptance, gamma2) * plain / (gamma2 * level1 + plain)
    return {"plain_bytes": plain, "level1_bytes": level1, "kv_share": batch * context * kv / plain, "speedup": speedup}
