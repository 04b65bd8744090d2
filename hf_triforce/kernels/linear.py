"""Linear layers for a few rows on the CPU: MKL runs ``x @ W.T`` with a handful of rows far below memory speed, while
``W @ x.T`` streams the weight once at close to memory speed. For one row it depends on the CPU (an AVX-512 one ran a
two-column product faster than MKL's matrix-vector path, an AVX2-only one the reverse), so that choice is timed once
per process and weight shape (:func:`one_row_product_faster`), as cuDNN's benchmark mode picks its algorithms. The
reference is ``F.linear``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

MIN_ROWS, MAX_ROWS = 1, 32
FEW_ROW_MARGIN = 1.1
"""How much faster than ``F.linear`` the two-column product must time to be taken for one row (``F.linear`` is plain
decoding's own product: ties keep it)."""
STREAM_BYTES, MAX_COPIES = 64 * 2**20, 64  # weights timed per choice: more than a CPU's last-level cache
_ONE_ROW_FASTER: dict[tuple, bool] = {}  # (weight shape, threads) -> whether the two-column product is faster


def use_small_batch_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` ``[..., K]`` is a few float32 CPU rows (:data:`MIN_ROWS` to :data:`MAX_ROWS`, no autograd) where
    :func:`small_batch_linear` is faster: two rows or more always, one row where :func:`one_row_product_faster`."""
    rows = x.numel() // max(x.shape[-1], 1)
    dense = weight.layout == torch.strided and x.layout == torch.strided
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
    eligible = dense and cpu32 and MIN_ROWS <= rows <= MAX_ROWS and not torch.is_grad_enabled()
    return eligible and (rows > 1 or one_row_product_faster(weight))


def one_row_product_faster(weight: torch.Tensor) -> bool:
    """Whether :func:`small_batch_linear`'s two-column product is at least :data:`FEW_ROW_MARGIN` times faster than
    ``F.linear`` for one row times ``weight`` ``[N, K]`` on this CPU: timed on first use per weight shape and thread
    count, then kept for the process (the choice changes float rounding only, never what is computed). Each path is
    timed over copies of the weight that together exceed the CPU's caches, as a forward streams its layers' weights
    from memory (tens of milliseconds per shape).

    Example:
        >>> isinstance(one_row_product_faster(torch.ones(8, 4)), bool)
        True
    """
    key = (tuple(weight.shape), torch.get_num_threads())
    faster = _ONE_ROW_FASTER.get(key)
    if faster is None:
        copies = [weight] + [weight.clone() for _ in range(_stream_copies(weight) - 1)]
        x = torch.ones(1, weight.shape[1])  # no random draw: the caller's generator is left alone
        two_column = _best_seconds(lambda: [small_batch_linear(x, w) for w in copies])
        plain = _best_seconds(lambda: [F.linear(x, w) for w in copies])
        faster = _ONE_ROW_FASTER[key] = plain > FEW_ROW_MARGIN * two_column
        us = 1e6 / len(copies)
        logger.debug("one-row linear %s: two-column %.0f us, F.linear %.0f us", key[0], two_column * us, plain * us)
    return faster


def _stream_copies(weight: torch.Tensor) -> int:
    """Copies of ``weight`` to time over: together :data:`STREAM_BYTES` (at most :data:`MAX_COPIES`)."""
    return max(1, min(MAX_COPIES, -(-STREAM_BYTES // max(1, weight.nbytes))))


def _best_seconds(run: Callable[[], object], repeats: int = 2) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


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
