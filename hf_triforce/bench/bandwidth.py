"""The bandwidth model of decoding and the speedup it predicts for TriForce.

A decoding step is memory bound: it reads every weight once and the keys/values it attends to once.
Its floor on a device of bandwidth ``B`` bytes/s is ``(weight bytes + attended tokens x KV bytes per
token) / B``. For Llama-2-7B (MHA, fp16) that is 0.5 MiB of KV per token; at 128K a full step reads
~13.5 GB of weights plus ~64 GB of KV.

Example:
    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig()  # its defaults are Llama-2-7B's shape
    >>> kv_bytes_per_token(cfg, 2) / 2**20
    0.5
    >>> step_bytes = weight_bytes(cfg, 2) + 131072 * kv_bytes_per_token(cfg, 2)  # a step at 128K
    >>> round(1e3 * step_bytes / PEAK_BANDWIDTH["H100"], 1)  # ms
    24.5
"""

from __future__ import annotations

from ..hf.model import config_windows

# Peak memory bandwidth in bytes/s, matched against torch.cuda.get_device_name(). A100: the 80 GB SXM part.
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 8.64e11, "RTX 4090": 1.008e12}


def text_config(config):
    """The text config of a (possibly multimodal) transformers config; the config itself otherwise.

    Example:
        >>> from transformers import LlamaConfig
        >>> text_config(LlamaConfig(num_hidden_layers=2)).num_hidden_layers
        2
    """
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def head_dim(config) -> int:
    """Per-head dimension of a transformers text config.

    Example:
        >>> from transformers import LlamaConfig
        >>> head_dim(LlamaConfig())  # Llama-2-7B's shape: 4096 / 32
        128
    """
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_heads(config) -> int:
    """Key/value heads of a transformers text config (its attention heads when it names none: MHA).

    Example:
        >>> from transformers import LlamaConfig
        >>> kv_heads(LlamaConfig(num_key_value_heads=8)), kv_heads(LlamaConfig())
        (8, 32)
    """
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """Key + value bytes one token adds to the cache: ``2 x layers x kv_heads x head_dim x dtype_bytes``."""
    return 2 * config.num_hidden_layers * kv_heads(config) * head_dim(config) * dtype_bytes


def weight_bytes(config, dtype_bytes: int) -> int:
    """Bytes of a Llama-architecture model's weights (embedding + layers + norm + untied lm_head).

    A mixture-of-experts config (``num_local_experts``/``num_experts``) counts every expert: what the weights take in
    memory. What a decoding step reads of them is :func:`read_weight_bytes`.

    Example:
        >>> from transformers import LlamaConfig
        >>> llama31_8b = LlamaConfig(intermediate_size=14336, num_key_value_heads=8, vocab_size=128256)
        >>> round(weight_bytes(llama31_8b, 2) / 1e9, 2)  # GB
        16.06
    """
    return layer_linear_bytes(config, dtype_bytes) + embedding_bytes(config, dtype_bytes)


def read_weight_bytes(config, dtype_bytes: int) -> int:
    """Bytes of weights one decoding step reads: :func:`weight_bytes`, but only the ``num_experts_per_tok`` experts a
    token is routed to (plus any shared expert and the router) in a mixture-of-experts layer. The input embedding
    table counts as read, as in the bench's floor (one row of it is; for Llama-3.1-8B that overstates the floor by
    1 GB of 16).

    Example:
        >>> from transformers import MixtralConfig
        >>> moe = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        ...                     num_key_value_heads=2, vocab_size=256, num_local_experts=8, num_experts_per_tok=2)
        >>> weight_bytes(moe, 2) > read_weight_bytes(moe, 2)
        True
    """
    return layer_linear_bytes(config, dtype_bytes, active=True) + embedding_bytes(config, dtype_bytes)


def layer_linear_bytes(config, dtype_bytes: int, active: bool = False) -> int:
    """Bytes of the decoder layers' projections: attention (q, k, v, o) and a gated MLP (gate, up, down: three
    ``hidden x intermediate`` matrices), all layers; ``active``: a mixture of experts' routed experts only.

    Example:
        >>> from transformers import LlamaConfig
        >>> tiny = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        ...                    num_key_value_heads=2, vocab_size=256)
        >>> layer_linear_bytes(tiny, 1)  # 2 layers x (64 x 16 x (2 x 4 + 2 x 2) + 3 x 64 x 128)
        73728
    """
    h, d = config.hidden_size, head_dim(config)
    attention = h * d * (2 * config.num_attention_heads + 2 * kv_heads(config))
    stored, read = mlp_parameters(config)
    return dtype_bytes * config.num_hidden_layers * (attention + (read if active else stored))


def mlp_parameters(config) -> tuple[int, int]:
    """Parameters of one decoder layer's MLP: ``(stored, read per token)``; equal for a dense MLP.

    A mixture of experts (``num_local_experts`` or ``num_experts``) stores every expert of
    ``moe_intermediate_size`` (else ``intermediate_size``) and a router, and reads ``num_experts_per_tok`` experts,
    the router and a shared expert (``shared_expert_intermediate_size``, or ``n_shared_experts`` experts) if any.
    Every layer counts as a MoE layer (``mlp_only_layers``/``first_k_dense_replace`` are not read).

    Example:
        >>> from transformers import MixtralConfig
        >>> mlp_parameters(MixtralConfig(hidden_size=8, intermediate_size=16, num_local_experts=4,
        ...                              num_experts_per_tok=2))  # (4 x 384 + 32, 2 x 384 + 32)
        (1568, 800)
    """
    h = config.hidden_size
    dense = getattr(config, "intermediate_size", None) or 4 * h
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if not experts:
        return 3 * h * dense, 3 * h * dense
    expert = 3 * h * (getattr(config, "moe_intermediate_size", None) or dense)
    shared_size = getattr(config, "shared_expert_intermediate_size", None) or 0
    shared = 3 * h * shared_size + (getattr(config, "n_shared_experts", None) or 0) * expert
    active = getattr(config, "num_experts_per_tok", None) or 1
    router = h * experts
    return experts * expert + shared + router, active * expert + shared + router


def embedding_bytes(config, dtype_bytes: int) -> int:
    """Bytes of the input embeddings, the lm_head when untied, and the norms (two a layer, one final).

    Example:
        >>> from transformers import LlamaConfig
        >>> tiny = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
        >>> embedding_bytes(tiny, 1)  # 256 x 64 x 2 + (2 x 2 + 1) x 64
        33088
    """
    h = config.hidden_size
    tables = 1 if getattr(config, "tie_word_embeddings", False) else 2
    return dtype_bytes * (config.vocab_size * h * tables + (2 * config.num_hidden_layers + 1) * h)


def attended_kv_bytes(config, tokens: int, dtype_bytes: int) -> int:
    """Key + value bytes a step attending to ``tokens`` cached tokens reads: every layer's ``tokens``, a sliding
    layer's at most its window. Also what transformers' plain cache holds for ``tokens`` tokens.

    Example:
        >>> from transformers import MistralConfig
        >>> shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> kv_bytes_per_token(MistralConfig(**shape), 2)  # 2 layers x 2 heads x 16 dims x (K, V) x 2 bytes
        256
        >>> [attended_kv_bytes(MistralConfig(**shape, sliding_window=w), 100, 2) for w in (4096, 10)]
        [25600, 2560]
    """
    per_layer = kv_bytes_per_token(config, dtype_bytes) // config.num_hidden_layers
    return per_layer * sum(tokens if w is None else min(tokens, w) for w in config_windows(config))


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
