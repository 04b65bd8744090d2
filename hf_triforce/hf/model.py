"""What hf_triforce reads off a transformers model: its family, attention setup, layers, rotary embedding; and
the one place that rewires a model's modules (the truncated-layer draft of the draft-quality evaluation)."""

from __future__ import annotations

import copy

import torch

from ..errors import UnsupportedModelError
from .distributed import tensor_parallel_size
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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[..., D]`` by ``cos``/``sin`` ``[..., R]`` (broadcast; ``R <= D``: the rest passes unrotated), in
    the ``rotate_half`` layout of Llama-style models (the first ``R`` channels, their halves paired).

    Example:
        >>> x = torch.tensor([[[[1.0, 0.0]]]])
        >>> apply_rope(x, torch.zeros(1, 1, 1, 2), torch.ones(1, 1, 1, 2)).tolist()
        [[[[0.0, 1.0]]]]
    """
    rotary = cos.shape[-1]
    part = x[..., :rotary]
    half = rotary // 2
    rotated = part * cos + torch.cat((-part[..., half:], part[..., :half]), dim=-1) * sin
    return rotated if rotary == x.shape[-1] else torch.cat((rotated, x[..., rotary:]), dim=-1)


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's output embedding (the length of its logits)."""
    return model.get_output_embeddings().weight.shape[0]


def num_layers(model: torch.nn.Module) -> int:
    """Decoder layers of a causal LM (of its text model, for multimodal configs)."""
    return model.config.get_text_config().num_hidden_layers


def context_limit(model: torch.nn.Module) -> int | None:
    """The longest sequence the model was configured for (``max_position_embeddings``), or None if it names none."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


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
    """Whether accelerate placed the model with hooks (``hf_device_map``): on several devices, or offloaded to
    disk (``{"": "disk"}``: every weight is loaded at its layer's forward, the parameters sit on ``meta``).

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
    """``(key/value heads, head dim)`` of this process's attention layers, from the config: a tensor-parallel
    model (``tp_plan``) holds ``1/tp_size`` of the KV heads on each rank."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads // tensor_parallel_size(model), head_dim


def eos_token_ids(generation_config) -> list[int]:
    """The end-of-sequence ids ``generate()`` stops at: ``generation_config.eos_token_id`` as a list.

    Example:
        >>> from transformers import GenerationConfig
        >>> eos_token_ids(GenerationConfig(eos_token_id=2)), eos_token_ids(GenerationConfig(eos_token_id=[2, 7]))
        ([2], [2, 7])
    """
    eos = generation_config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def truncated_model(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A draft model made of ``model``'s first ``num_layers`` layers, final norm and LM head (shared weights).

    The draft is a new instance of ``model``'s class, built on the meta device and then given ``model``'s own
    embedding, rotary embedding, first decoder layers, final norm and LM head (no weight is copied): an
    "early exit" of the target, in eval mode, with a copy of its generation config.

    Args:
        model: a Llama-style causal LM (``model.model.layers``, ``.norm``, ``.embed_tokens``, ``.rotary_emb``).
        num_layers: decoder layers kept (``1 <= num_layers <=`` the model's).

    Raises:
        UnsupportedModelError: the model does not have that layout, or ``num_layers`` is out of range.

    Example:
        >>> draft = truncated_model(model, 4)  # doctest: +SKIP
        >>> draft.config.num_hidden_layers, draft.lm_head is model.lm_head  # doctest: +SKIP
        (4, True)
    """
    inner = getattr(model, "model", None)
    parts = ("layers", "norm", "embed_tokens", "rotary_emb")
    if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a Llama-style causal LM (model.layers, norm, embed_tokens, rotary_emb, "
            "lm_head): a truncated-layer draft cannot be built from it; pass --draft-layers 0 to skip it."
        )
    total = len(inner.layers)
    if not 1 <= num_layers <= total:
        raise UnsupportedModelError(f"draft layers must be in [1, {total}], got {num_layers}.")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = type(model)(config)
    draft.model.embed_tokens, draft.model.norm = inner.embed_tokens, inner.norm
    draft.model.rotary_emb = inner.rotary_emb
    draft.model.layers = torch.nn.ModuleList(inner.layers[:num_layers])
    draft.lm_head = model.lm_head
    left = [name for name, t in (*draft.named_parameters(), *draft.named_buffers()) if t.is_meta]
    if left:
        raise UnsupportedModelError(f"truncated draft of {type(model).__name__} has unshared tensors {left[:3]}.")
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()
