"""Triton kernel body of the split-KV verification attention (see :mod:`.verification`).

Jitted lazily, once per mode, and builtins only, as :mod:`._retrieval_triton` explains. Its two reductions use combine
functions jitted here in the same mode, read as the globals ``MAXIMUM`` and ``ADD`` (a combine function must be a
``JITFunction`` when compiled, not a constexpr argument), which :func:`launcher` sets before every launch.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import triton
import triton.language as tl


def _maximum(a, b):
    return tl.maximum(a, b)


def _add(a, b):
    return a + b


def split_kv_kernel(
    q_ptr, k_ptr, v_ptr, acc_ptr, m_ptr, l_ptr,
    kv_heads, q_len, kv_len, head_dim, split_len, scale,
    stride_qb, stride_qh, stride_qq, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ab, stride_ah, stride_as, stride_am,
    stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: KV head ``(b, h)``, keys ``[pid_s * split_len, +split_len)``, every query row of its group.

    Row ``r = g * q_len + i`` is query token ``i`` of head ``h * GROUP + g``, causal bottom-right (keys
    ``0 .. kv_len - q_len + i``). Writes the split's unnormalized ``acc`` ``[BLOCK_M, D]``, max ``m`` and sum ``l``
    (float32) for the caller's merge. Dots in ``PRECISION`` (``tf32`` covers a half-precision mantissa).
    """
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // kv_heads).to(tl.int64)
    h = (pid_bh % kv_heads).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    g = rows // q_len
    i = rows % q_len
    row_ok = rows < GROUP * q_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_ptrs = q_ptr + b * stride_qb + (h * GROUP + g)[:, None] * stride_qh + i[:, None] * stride_qq
    q = tl.load(q_ptrs + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    last = kv_len - q_len + i  # the last key each row sees
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s_sum = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    start = pid_s * split_len
    end = tl.minimum(start + split_len, kv_len)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        k = tl.load(k_base + offs_n[None, :] * stride_kl + offs_d[:, None] * stride_kd,
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0).to(tl.float32)  # fmt: skip
        s = tl.dot(q, k, input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N] float32
        s = tl.where(n_ok[None, :] & (offs_n[None, :] <= last[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.reduce(s, 1, MAXIMUM))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at zero
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        s_sum = s_sum * alpha + tl.reduce(p, 1, ADD)
        v = tl.load(v_base + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    a_ptrs = acc_ptr + b * stride_ab + h * stride_ah + pid_s * stride_as + rows[:, None] * stride_am
    tl.store(a_ptrs + offs_d[None, :], acc, mask=d_ok[None, :])
    ml = b * stride_mb + h * stride_mh + pid_s * stride_ms + rows
    tl.store(m_ptr + ml, m)
    tl.store(l_ptr + ml, s_sum)


MAXIMUM = None  # the combine functions of the mode launching now (see the module docstring)
ADD = None


@functools.cache
def compiled_kernels(interpret: bool) -> SimpleNamespace:
    """The kernel and its combine functions, jitted for one mode (the cache key; see the module docstring)."""
    del interpret
    return SimpleNamespace(
        split_kv=triton.jit(split_kv_kernel, do_not_specialize=["kv_len", "split_len"]),
        maximum=triton.jit(_maximum),
        add=triton.jit(_add),
    )


def launcher(interpret: bool):
    """The split-KV kernel of this mode, its combine functions installed as ``MAXIMUM``/``ADD``."""
    kernels = compiled_kernels(interpret)
    globals().update(MAXIMUM=kernels.maximum, ADD=kernels.add)
    return kernels.split_kv
