"""A model's ``nn.Linear`` layers swapped for a call: the CPU few-row path, and level 1's low-bit weight copies. Layers
transformers' integrations own (hooked, subclassed, tensor-subclass weights) are left alone."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch

from ..kernels.int4_linear import Int4Weight, int4_kernel_supports, int4_linear, quantize_int4
from ..kernels.int8_linear import Int8Weight, int8_kernel_supports, int8_linear, quantize_int8, use_int8_linear
from ..kernels.linear import linear_forward
from .quantization import is_plain_linear

logger = logging.getLogger(__name__)

Int8Copy = dict[torch.nn.Linear, Int8Weight]
LowBitCopy = dict[torch.nn.Linear, Int8Weight | Int4Weight]
T = TypeVar("T")
_INT8_COPIES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, Int8Copy]] = weakref.WeakKeyDictionary()
_INT4_COPIES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, LowBitCopy]] = weakref.WeakKeyDictionary()


def _plain_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain (not subclassed, plain weight), unhooked ``nn.Linear`` layers."""
    return [m for m in model.modules() if is_plain_linear(m)]


_LEVEL1: contextvars.ContextVar[bool] = contextvars.ContextVar("triforce_level1_weights", default=False)
"""True inside :func:`level1_linears`: the swapped layers multiply by level 1's low-bit copy."""


@contextlib.contextmanager
def swapped_linears(models: Iterable[torch.nn.Module | None], level1: LowBitCopy | None = None) -> Iterator[None]:
    """Within the block, the models' plain ``nn.Linear`` layers run the CPU few-row path
    (:func:`~hf_triforce.kernels.linear.linear_forward`) and, inside :func:`level1_linears`, ``level1``'s low-bit
    weights (an int8 layer given more rows than its kernel serves uses its own weights)."""
    plain = [m for model in models if model is not None for m in _plain_layers(model)]
    layers = {id(m): m for m in plain if "forward" not in vars(m)}.values()  # each once, none already swapped
    level1 = level1 or {}
    for layer in layers:
        layer.forward = functools.partial(_swapped_forward, layer, level1.get(layer))
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


@contextlib.contextmanager
def level1_linears() -> Iterator[None]:
    """Within the block (level 1's forwards), the layers :func:`swapped_linears` holds a low-bit copy of use it."""
    token = _LEVEL1.set(True)
    try:
        yield
    finally:
        _LEVEL1.reset(token)


def _swapped_forward(layer: torch.nn.Linear, low_bit: Int8Weight | Int4Weight | None, x: torch.Tensor) -> torch.Tensor:
    if low_bit is not None and _LEVEL1.get():
        if isinstance(low_bit, Int4Weight):
            return int4_linear(x, low_bit, layer.bias)
        if use_int8_linear(x):
            return int8_linear(x, low_bit, layer.bias)
    return linear_forward(layer, x)


def level1_copy(model: torch.nn.Module, weights: str) -> LowBitCopy | None:
    """Level 1's ``weights`` copy of ``model`` (``"int8"``, ``"int4"``; ``None`` for ``"full"``)."""
    make = {"int8": int8_weight_copy, "int4": int4_weight_copy}.get(weights)
    return None if make is None else make(model)


def int8_weight_copy(model: torch.nn.Module) -> Int8Copy:
    """The int8 copy of ``model``'s plain ``nn.Linear`` weights the kernel serves, kept beside the model (remade
    when a weight changed)."""
    layers = [m for m in _plain_layers(model) if int8_kernel_supports(m.weight)]
    key = tuple(weight_fingerprint(m.weight) for m in layers)
    return kept_beside(_INT8_COPIES, model, key, lambda: _quantized(layers, "int8", lambda m: quantize_int8(m.weight)))


def int4_weight_copy(model: torch.nn.Module) -> LowBitCopy:
    """An int4 copy of ``model``'s plain ``nn.Linear`` projections (int8 where int4 does not serve the shape) and
    an int8 copy of its output embeddings (level 1 samples from its logits), kept beside the model."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    param = next(model.parameters(), None)
    # no int8 kernel on CUDA: the head and the shapes int4 does not serve keep their own weights
    if param is not None and param.device.type == "cuda":
        layers = [m for m in _plain_layers(model) if m is not head and int4_kernel_supports(m.weight)]
    else:
        layers = [m for m in _plain_layers(model) if int8_kernel_supports(m.weight)]
    key = tuple(weight_fingerprint(m.weight) for m in layers)
    return kept_beside(_INT4_COPIES, model, key, lambda: _quantized(layers, "int4", lambda m: _int4_or_int8(m, head)))


def _int4_or_int8(layer: torch.nn.Linear, head: torch.nn.Module | None) -> Int8Weight | Int4Weight:
    if layer is not head and int4_kernel_supports(layer.weight):
        return quantize_int4(layer.weight)
    return quantize_int8(layer.weight)


def _quantized(layers: list[torch.nn.Linear], name: str, quantize: Callable) -> LowBitCopy:
    """``{layer: quantize(layer)}``, timed and logged."""
    start = time.perf_counter()
    copy = {m: quantize(m) for m in layers}
    mib = sum(w.nbytes() for w in copy.values()) / 2**20
    logger.info("made level 1's %s weight copy (%.0f MiB) in %.2fs", name, mib, time.perf_counter() - start)
    return copy


def kept_beside(store: weakref.WeakKeyDictionary, model: torch.nn.Module, key: tuple, make: Callable[[], T]) -> T:
    """What ``store`` (weak in the model) keeps for ``model`` under ``key``, else ``make()``'s, kept from now on.

    Example:
        >>> store, model = weakref.WeakKeyDictionary(), torch.nn.Linear(2, 2)
        >>> kept_beside(store, model, (1,), lambda: "a"), kept_beside(store, model, (1,), lambda: "b")
        ('a', 'a')
        >>> kept_beside(store, model, (2,), lambda: "b")
        'b'
    """
    kept = store.get(model)
    if kept is not None and kept[0] == key:
        return kept[1]
    value = make()
    store[model] = (key, value)
    return value


def drop_int8_copy(model: torch.nn.Module) -> None:
    """Free ``model``'s int8 and int4 weight copies, if made.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 8))
        >>> copy = int8_weight_copy(model); drop_int8_copy(model)
        >>> int8_weight_copy(model) is copy
        False
    """
    _INT8_COPIES.pop(model, None)
    _INT4_COPIES.pop(model, None)


def weight_fingerprint(weight: torch.Tensor) -> tuple[int, int]:
    """Where the weight lives and how often it was written in place (inference tensors have no such count); a stale
    copy would only lower level 1's acceptance: level 2 verifies with the weights themselves."""
    return weight.data_ptr(), -1 if weight.is_inference() else weight._version
