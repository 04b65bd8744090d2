"""What hf_triforce reads off a transformers model: its family, attention setup, layers, rotary embedding."""

from __future__ import annotations

import torch

from ..errors import UnsupportedModelError
from .masks import has_mask_function

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""``config.model_type`` values that :func:`hf_triforce.enable` accepts: decoder-only RoPE families, MHA or GQA."""


def check_model_supported(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless ``model`` is a supported decoder-only RoPE family."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"hf_triforce does not support model_type={model_type!r}. Supported families: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (Llama 2/3.x, SmolLM, Mistral, Qwen2/2.5, Qwen3, Phi-3)."
        )
    base = config._attn_implementation
    if base != "eager" and not has_mask_function(base):
        raise UnsupportedModelError(
            f"attn_implementation={base!r} has no causal-mask function; load the model with "
            "attn_implementation='sdpa' or 'eager'."
        )


def rotary_inv_freq(model: torch.nn.Module) -> torch.Tensor:
    """The ``[head_dim // 2]`` (or partial) rotary inverse frequencies of a Llama-style model."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no model.rotary_emb.inv_freq (RoPE) to re-rotate with."
        )
    return inv_freq.detach().float()


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's output embedding (the length of its logits)."""
    return model.get_output_embeddings().weight.shape[0]


def num_layers(model: torch.nn.Module) -> int:
    """Decoder layers of a causal LM (of its text model, for multimodal configs)."""
    return model.config.get_text_config().num_hidden_layers


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The decoder layers (``model.model.layers``) of a Llama-style causal LM, or ``None``."""
    return getattr(getattr(model, "model", None), "layers", None)


def attn_implementation(model: torch.nn.Module) -> str:
    """The attention implementation the model runs (``config._attn_implementation``)."""
    return model.config._attn_implementation


def rope_types(model: torch.nn.Module) -> list[str]:
    """The RoPE type(s) of the model's rotary embedding (``["default"]`` when it names none)."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    rope = getattr(rotary, "rope_type", "default")
    return list(rope.values()) if isinstance(rope, dict) else [rope]


def is_dispatched(model: torch.nn.Module) -> bool:
    """Whether accelerate placed the model on several devices (``hf_device_map``: offload or model parallel)."""
    device_map = getattr(model, "hf_device_map", None)
    return bool(device_map) and len(set(device_map.values())) > 1


def kv_shape(model: torch.nn.Module) -> tuple[int, int]:
    """``(key/value heads, head dim)`` of the model's attention layers, from its config."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim
