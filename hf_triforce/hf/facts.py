"""What a call's plan needs to know about a model, read off it once: device, attention, layers, kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.int4_linear import int4_kernel_available
from ..kernels.int8_linear import int8_kernel_available
from .direct_forward import direct_forward_problem
from .distributed import tensor_parallel_size
from .masks import mask_kind
from .model import attn_implementation, is_dispatched, model_problem, rope_types
from .quantization import quantized_linears, rows_interact
from .versions import cache_layer_types


@dataclass(frozen=True)
class ModelFacts:
    """What decides which TriForce paths can run on a model (:mod:`hf_triforce.generation.plan` reads them)."""

    unsupported: str | None  # why TriForce cannot serve the model (None: it can, and the other facts are read)
    device: str
    dtype: torch.dtype
    attention: str
    fixed_masks: bool  # hf_triforce can build this attention's mask for fixed-shape steps (sdpa or eager)
    sliding: bool
    softcap: bool
    sinks: bool
    dispatched: bool  # accelerate placed it over several devices or offloaded it
    tensor_parallel: bool
    dynamic_rope: bool  # its RoPE recomputes frequencies from the positions (a CUDA graph cannot hold that)
    direct_layout: str | None  # why level 1's direct forward cannot run its layers (None: it can)
    int8_kernel: bool  # this torch has the CPU int8 weight-only kernel
    int4_kernel: bool  # this torch has the int4 weight-only kernel for the model's device
    quantized: str | None = None  # what quantizes its linear layers (None: plain float nn.Linear layers)
    rows_interact: str | None = None  # why a token's logits depend on the others of its forward (LLM.int8)


def model_facts(model: torch.nn.Module) -> ModelFacts:
    """:class:`ModelFacts` of ``model`` (only ``unsupported`` is read off a model TriForce cannot serve)."""
    unsupported = model_problem(model)
    if unsupported is not None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        unsupported = f"{type(model).__name__} (model_type={model_type!r}): {unsupported}"
    parameter = next(model.parameters(), None)
    if unsupported is not None or parameter is None:  # nothing else is read off it
        unsupported = unsupported or f"{type(model).__name__} has no parameters"
        device, dtype = ("meta", torch.float32) if parameter is None else (parameter.device.type, parameter.dtype)
        return ModelFacts(unsupported, device, dtype, "", False, False, False, False, False, False, False,
                          unsupported, False, False)  # fmt: skip
    text = model.config.get_text_config()
    return ModelFacts(
        unsupported=None,
        device=parameter.device.type,
        dtype=parameter.dtype,
        attention=attn_implementation(model),
        fixed_masks=mask_kind(model) is not None,
        sliding="sliding_attention" in cache_layer_types(text),
        softcap=bool(getattr(text, "attn_logit_softcapping", None)),
        sinks=any(hasattr(m, "sinks") for m in model.modules()),
        dispatched=is_dispatched(model),
        tensor_parallel=tensor_parallel_size(model) > 1,
        dynamic_rope=any("dynamic" in rope or rope == "longrope" for rope in rope_types(model)),
        direct_layout=direct_forward_problem(model),
        int8_kernel=int8_kernel_available(),
        int4_kernel=int4_kernel_available(parameter.device),
        quantized=quantized_linears(model),
        rows_interact=rows_interact(model),
    )
