"""Linear layers for a few rows on the CPU: MKL runs ``x @ W.T`` with a handful of rows far below memory speed, while
``W @ x.T`` streams the weight once at close to memory speed. The reference is ``F.linear``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_ROWS, MAX_ROWS = 1, 32


def use_small_batch_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` ``[..., K]`` is a few float32 CPU rows, where :func:`small_batch_linear` is faster."""
    rows = x.numel() // max(x.shape[-1], 1)
    dense = weight.layout == torch.strided and x.layout == torch.strided
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
    return dense and cpu32 and MIN_ROWS <= rows <= MAX_ROWS and not torch.is_grad_enabled()


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as ``(weight @ x.T).T``: ``[..., K]`` x ``[N, K]`` -> ``[..., N]``, contiguous."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1:  # MKL's matrix-vector path is several times slower than a 2-column product
        out = torch.mm(weight, rows.repeat(2, 1).t())[:, :1].t().contiguous()
    else:
        out = torch.mm(weight, rows.t()).t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, through :func:`small_batch_linear` where it is faster."""
    if use_small_batch_linear(x, module.weight):
        return small_batch_linear(x, module.weight, module.bias)
    return F.linear(x, module.weight, module.bias)
