"""What a quantized model is, read off its modules (its own layer class, or a tensor-subclass weight): which linear
layers carry no plain float weight, and whether a token's output depends on the other tokens of the same forward."""

from __future__ import annotations

import torch


def is_plain_linear(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an ``nn.Linear`` itself (not a subclass) with a plain tensor weight, no accelerate hook."""
    return (
        type(module) is torch.nn.Linear
        and type(module.weight) in (torch.nn.Parameter, torch.Tensor)
        and not hasattr(module, "_hf_hook")
    )


def _quantized(module: torch.nn.Module) -> bool:
    """A linear layer of any integration (AWQ's, GPTQ's, HQQ's are no ``nn.Linear``) other than a plain one."""
    if type(module) is torch.nn.Linear:
        return type(module.weight) not in (torch.nn.Parameter, torch.Tensor)  # a weight tensor subclass (torchao)
    return isinstance(module, torch.nn.Linear) or (hasattr(module, "in_features") and hasattr(module, "out_features"))


def quantization_method(model: torch.nn.Module) -> str | None:
    """``config.quantization_config``'s ``quant_method`` (``"bitsandbytes"``, ``"quanto"``, ``"torchao"``, ``"awq"``,
    ``"gptq"``, ...), or ``None`` when the model was not loaded with one."""
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if config is None:
        return None
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return None if method is None else str(getattr(method, "value", method))


def quantized_linears(model: torch.nn.Module) -> str | None:
    """What quantizes ``model``'s linear layers (``None``: every one is a plain float ``nn.Linear``), for messages:
    the method and the layer (or weight) classes."""
    kinds = set()
    for module in model.modules():
        if _quantized(module):
            kinds.add(type(module.weight).__name__ if type(module) is torch.nn.Linear else type(module).__name__)
    if not kinds:
        return None
    method = quantization_method(model)
    by = f" with {method}" if method else ""
    return f"its linear layers are quantized{by} ({', '.join(sorted(kinds))})"


def rows_interact(model: torch.nn.Module) -> str | None:
    """Why a token's output in a multi-token forward of ``model`` depends on the other tokens of that forward
    (``None``: it does not, up to floating-point rounding).

    bitsandbytes' LLM.int8 (``llm_int8_threshold > 0``) picks outlier columns over all the tokens of a forward, so
    verifying several drafts in one forward gives other logits than plain decoding's one-token forwards."""
    thresholds = {
        float(threshold)
        for module in model.modules()
        if _quantized(module) and (threshold := getattr(getattr(module, "state", None), "threshold", 0.0))
    }
    if not thresholds:
        return None
    shown = ", ".join(f"{t:g}" for t in sorted(thresholds))
    return (
        f"its 8-bit layers split outlier columns (llm_int8_threshold={shown}) found over all the tokens of a forward, "
        "so a verified token's logits depend on the tokens verified with it and differ from plain decoding's"
    )
