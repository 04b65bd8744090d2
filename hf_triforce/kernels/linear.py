"""Linear layers for a few rows on the CPU: MKL runs ``x @ W.T`` with a handful of rows far below memory speed, while
``W @ x.T`` streams the weight once at close to memory speed. For one row it depends on the CPU's vector unit: on an
AVX-512 CPU the two-column product beat MKL's matrix-vector path inside a forward, on an AVX2-only one MKL's was faster
(:func:`one_row_product_faster`). The choice is read from what the CPU is, never from a clock, so every process and
every tensor-parallel rank on one machine multiplies alike. The reference is ``F.linear``."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

MIN_ROWS, MAX_ROWS = 1, 32
TWO_COLUMN_CAPABILITIES = frozenset({"AVX512"})
"""ATen CPU capabilities (``torch.backends.cpu.get_cpu_capability()``) where one row takes the two-column product:
measured faster there inside a forward; elsewhere ``F.linear``, plain decoding's own product."""


def use_small_batch_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` ``[..., K]`` is a few float32 CPU rows (:data:`MIN_ROWS` to :data:`MAX_ROWS`, no autograd) where
    :func:`small_batch_linear` is faster: two rows or more always, one row where :func:`one_row_product_faster`."""
    rows = x.numel() // max(x.shape[-1], 1)
    dense = weight.layout == torch.strided and x.layout == torch.strided
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
    eligible = dense and cpu32 and MIN_ROWS <= rows <= MAX_ROWS and not torch.is_grad_enabled()
    return eligible and (rows > 1 or one_row_product_faster())


@functools.cache
def one_row_product_faster() -> bool:
    """Whether one row times a weight takes :func:`small_batch_linear`'s two-column product rather than ``F.linear``
    on this CPU: where its ATen capability is in :data:`TWO_COLUMN_CAPABILITIES`. A fact of the CPU, read once, so
    the choice (which changes float rounding only, never what is computed) is the same in every process and rank.

    Example:
        >>> isinstance(one_row_product_faster(), bool)
        True
    """
    return torch.backends.cpu.get_cpu_capability() in TWO_COLUMN_CAPABILITIES


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as ``(weight @ x.T).T``: ``[..., K]`` x ``[N, K]`` -> ``[..., N]``, contiguous."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1:  # MKL's matrix-vector path can be several times slower than a 2-column product
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
