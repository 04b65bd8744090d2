"""What hf_triforce reads off a transformers model: its family, attention setup, layers, rotary embedding."""

from __future__ import annotations

import sys

import torch

from ..errors import UnsupportedModelError
from .distributed import tensor_parallel_size
from .versions import cache_layer_types

TESTED_MODEL_TYPES = (
    "llama", "mistral", "ministral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma", "gemma2",
    "gemma3_text", "granite", "olmo2", "olmo3", "cohere", "cohere2", "glm4", "starcoder2", "stablelm", "smollm3",
    "exaone4", "helium", "gpt_oss",
)  # fmt: skip
"""``config.model_type`` of the tested families; :func:`model_problem` decides from the model, not from this list."""
SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")
"""KV-cache layer kinds TriForce serves (per-token keys and values)."""


def model_problem(model: torch.nn.Module) -> str | None:
    """Why TriForce cannot serve ``model`` (what it lacks, and what to do), or ``None`` when it can (the rotary
    embedding is needed: a StreamingLLM draft cache moves keys to new positions with it)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return "it is not a transformers model (no PreTrainedConfig)"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; TriForce drafts for decoder-only causal LMs"
    generates = getattr(model, "can_generate", lambda: False)()
    if getattr(model, "get_output_embeddings", lambda: None)() is None or not generates:
        return "it has no causal LM head: load it with AutoModelForCausalLM"
    text = config.get_text_config(decoder=True)
    if getattr(text, "kv_lora_rank", None):
        return (
            "its attention caches a compressed KV (multi-head latent attention, as in DeepSeek-V2/V3), not per-token "
            "keys and values that a retrieval view can gather"
        )
    other = sorted(set(cache_layer_types(text)) - set(SERVED_LAYER_TYPES))
    if other:
        return (
            f"it has layers of kind {', '.join(other)} (state-space, linear or chunked attention: Jamba, Falcon-H1, "
            "Qwen3-Next, Llama 4, ...), whose cache is a recurrent state or a chunk rather than the keys and values "
            "of every earlier token"
        )
    if not attention_modules(model):
        return "its attention does not go through transformers' attention interface, where TriForce reads queries"
    if not _rotary_buffers(model):
        return "it has no rotary position embedding (model.rotary_emb); learned absolute positions cannot be moved"
    return None


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules with a ``layer_idx`` whose modeling file dispatches through ``ALL_ATTENTION_FUNCTIONS``."""
    found = []
    for module in model.modules():
        modeling = sys.modules.get(type(module).__module__)
        named = type(module).__name__.endswith("Attention") and not isinstance(module, torch.nn.MultiheadAttention)
        if hasattr(module, "layer_idx") and hasattr(modeling, "ALL_ATTENTION_FUNCTIONS") and named:
            found.append(module)
    return found


def _rotary_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The rotary inverse frequencies: ``{"": inv_freq}``, or one per layer kind (Gemma 3); ``{}`` without RoPE."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None:
        return {}
    buffers = {name.removesuffix("inv_freq").rstrip("_"): buf for name, buf in rotary.named_buffers(recurse=False)}
    return {kind: buf for kind, buf in buffers.items() if not kind.endswith("original") and buf.dim() == 1}


def layer_rotary(model: torch.nn.Module) -> tuple[list[torch.Tensor], bool]:
    """How each decoder layer rotates its keys: ``([R] inverse frequencies per layer, interleaved)``.

    The frequencies cover a head's first ``2 R`` channels (partial rotary: ``R < head_dim / 2``); ``interleaved``
    (read off the modeling file's ``rotate_half``) pairs them ``(2i, 2i + 1)`` (Cohere, GLM), else ``(i, i + R)``."""
    buffers = _rotary_buffers(model)
    if not buffers:
        raise UnsupportedModelError(f"{type(model).__name__} has no rotary position embedding (model.rotary_emb).")
    kinds = cache_layer_types(model.config.get_text_config(decoder=True))
    freqs = [buffers.get("", buffers.get(kind, next(iter(buffers.values())))) for kind in kinds]
    modules = attention_modules(model)
    rotate_half = getattr(sys.modules.get(type(modules[0]).__module__) if modules else None, "rotate_half", None)
    interleaved = rotate_half is not None and rotate_half(torch.arange(4.0))[:2].tolist() == [-1.0, 0.0]  # not -2, -3
    return [f.detach().float() for f in freqs], interleaved


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate ``x`` ``[..., D]`` by ``cos``/``sin`` ``[..., R]`` (``R <= D``: the rest passes unrotated), Llama's
    ``rotate_half`` layout or, with ``interleaved``, Cohere's and GLM's (``cos``/``sin`` repeat each angle twice).

    Example:
        >>> x = torch.tensor([[[[1.0, 0.0]]]])
        >>> apply_rope(x, torch.zeros(1, 1, 1, 2), torch.ones(1, 1, 1, 2)).tolist()
        [[[[0.0, 1.0]]]]
        >>> apply_rope(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4), torch.ones(4), interleaved=True).tolist()
        [0.0, 1.0, -1.0, 0.0]
    """
    rotary = cos.shape[-1]
    part = x[..., :rotary]
    if interleaved:
        turned = torch.stack((-part[..., 1::2], part[..., 0::2]), dim=-1).flatten(-2)
    else:
        half = rotary // 2
        turned = torch.cat((-part[..., half:], part[..., :half]), dim=-1)
    rotated = part * cos + turned * sin
    return rotated if rotary == x.shape[-1] else torch.cat((rotated, x[..., rotary:]), dim=-1)


def rope_matrices(cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """The rotation of :func:`apply_rope` (``rotate_half`` layout) as one matrix per token: ``[q, dim, dim]`` from
    ``cos``/``sin`` ``[q, R]`` (``R <= dim``; the rest passes unrotated), so that ``x @ M[i]`` rotates row ``x``
    ``[..., dim]`` of token ``i``: one product instead of apply_rope's seven small operations a layer (each output sums
    at most two nonzero terms, so it matches :func:`apply_rope` to rounding).

    Example:
        >>> x, cos, sin = torch.randn(3, 4, 8), torch.randn(3, 6), torch.randn(3, 6)
        >>> rotated = torch.bmm(x, rope_matrices(cos, sin, 8))
        >>> torch.allclose(rotated, apply_rope(x, cos[:, None], sin[:, None]), atol=1e-6)
        True
    """
    rotary, half = cos.shape[-1], cos.shape[-1] // 2
    eye = torch.eye(dim, dtype=cos.dtype, device=cos.device).expand(cos.shape[0], dim, dim)
    matrices = eye.clone()
    matrices[:, :rotary, :rotary] = torch.diag_embed(cos)
    first, second = torch.arange(half, device=cos.device), torch.arange(half, rotary, device=cos.device)
    matrices[:, second, first] = -sin[:, :half]  # output i < half takes -x[i + half] * sin[i]
    matrices[:, first, second] = sin[:, half:]  # output i >= half takes x[i - half] * sin[i]
    return matrices


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's output embedding (the length of its logits)."""
    return model.get_output_embeddings().weight.shape[0]


def num_layers(model: torch.nn.Module) -> int:
    """Decoder layers of a causal LM (of its text model, for multimodal configs)."""
    return model.config.get_text_config().num_hidden_layers


def context_limit(model: torch.nn.Module) -> int | None:
    """``max_position_embeddings``, or ``None``."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The decoder layers (``model.model.layers``) of a Llama-style causal LM, or ``None``."""
    return getattr(getattr(model, "model", None), "layers", None)


def layer_windows(model: torch.nn.Module) -> list[int | None]:
    """Each decoder layer's sliding window, ``None`` for a layer that attends in full."""
    return config_windows(model.config.get_text_config())


def config_windows(text_config) -> list[int | None]:
    """:func:`layer_windows` read off a text config (no model needed), as transformers builds the cache.

    Example:
        >>> from transformers import MistralConfig
        >>> config_windows(MistralConfig(num_hidden_layers=2, sliding_window=64))
        [64, 64]
    """
    window = getattr(text_config, "sliding_window", None)
    return [window if kind == "sliding_attention" else None for kind in cache_layer_types(text_config)]


def attn_implementation(model: torch.nn.Module) -> str:
    """``config._attn_implementation``."""
    return model.config._attn_implementation


def rope_types(model: torch.nn.Module) -> list[str]:
    """The RoPE type(s) of the model's rotary embedding (``["default"]`` when it names none)."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    rope = getattr(rotary, "rope_type", "default")
    return list(rope.values()) if isinstance(rope, dict) else [rope]


def is_dispatched(model: torch.nn.Module) -> bool:
    """Whether accelerate placed the model (``hf_device_map``) on several devices or offloaded it to disk.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> model.hf_device_map = {"": "disk"}
        >>> is_dispatched(model), is_dispatched(torch.nn.Linear(2, 2))
        (True, False)
    """
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return False
    placements = set(device_map.values())
    return len(placements) > 1 or "disk" in placements


def kv_shape(model: torch.nn.Module) -> tuple[int, int]:
    """``(KV heads, head dim)`` on this rank (a tensor-parallel rank holds ``1/tp_size`` of the KV heads)."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads // tensor_parallel_size(model), head_dim


LEVEL1_BYTES_PER_WEIGHT = {"int8": 1.0, "int4": 0.5 + 4 / 32}
"""Bytes level 1's copy holds per weight of a decoder layer's projections: int8 values, or int4 values with a bfloat16
scale and zero per group of 32 (its LM head is int8 with either)."""


def step_bytes(model: torch.nn.Module, level1_weights: str) -> tuple[int, int, int]:
    """Bytes one decoding forward reads, from the model's shapes: ``(the model's weights, level 1's weights of kind
    ``level1_weights``, keys and values of one token of context over the full-attention layers)``. The input
    embedding counts one row (a tied output embedding counts in full, as the head).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        ...                      num_attention_heads=4, num_key_value_heads=2)
        >>> weights, level1, kv = step_bytes(LlamaForCausalLM(config), "full")
        >>> kv  # 2 (keys, values) x 2 layers x 2 KV heads x head dim 4 x 4 bytes
        128
    """
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    size = head.element_size()
    params = {id(p): p for p in model.parameters()}
    weights = sum(p.numel() * p.element_size() for key, p in params.items() if key != id(embed))
    weights += embed.shape[-1] * embed.element_size() + (head.numel() * size if head is embed else 0)
    layers = decoder_layers(model) or []
    projections = sum(m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear))
    per_weight = LEVEL1_BYTES_PER_WEIGHT.get(level1_weights)
    level1 = weights  # full weights; a low-bit copy replaces the projections, and the head by int8
    if per_weight is not None:
        level1 -= int(projections * (size - per_weight)) + head.numel() * (size - 1)
    kv_heads, head_dim = kv_shape(model)
    full_layers = sum(window is None for window in layer_windows(model))
    return weights, level1, 2 * full_layers * kv_heads * head_dim * size
