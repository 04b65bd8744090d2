"""The CPU few-row linear patch: a model's ``nn.Linear`` layers through ``kernels.linear.linear_forward``.

Patching leaves alone the layers that transformers' integrations own: layers wrapped by accelerate hooks
(``_hf_hook``: offload, device maps) and subclasses of ``nn.Linear`` (quantized layers).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from ..kernels.linear import linear_forward


@contextlib.contextmanager
def small_batch_linears(*models: torch.nn.Module | None) -> Iterator[None]:
    """Within the block, the models' ``nn.Linear`` layers use :func:`~hf_triforce.kernels.linear.linear_forward`.

    Multi-token forwards of a few rows (verification of drafts) then run at about the cost of a
    single-token step on the CPU. Layers wrapped by accelerate hooks, and subclasses of ``nn.Linear``
    (quantized layers), are left alone.
    """
    layers = {
        id(m): m
        for model in models
        if model is not None
        for m in model.modules()
        if type(m) is torch.nn.Linear and "forward" not in vars(m) and not hasattr(m, "_hf_hook")
    }.values()
    for layer in layers:
        layer.forward = functools.partial(linear_forward, layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
