"""Triton kernel bodies for retrieval (imported only when Triton is used; see :mod:`.retrieval`).

Jitted by :func:`compiled_kernels` on first use, once per mode, not at import: ``triton.jit`` reads
``TRITON_INTERPRET`` at decoration. For the same reason they call only Triton builtins, never its ``@jit`` standard
library (``tl.sum``, jitted in the mode of Triton's first import): a row sum is ``tl.reduce(x, 1, _sum_combine)``.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import triton
import triton.language as tl


def score_chunks_kernel(
    q_ptr, s_ptr, out_ptr, kv_heads, n_chunks, head_dim,
    stride_qb, stride_qh, stride_qd, stride_sb, stride_sh, stride_sc, stride_sd, stride_ob, stride_oh, stride_oc,
    GROUP: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program: KV head ``(b, h)``, chunks ``[pid_c * BLOCK_C, +BLOCK_C)``; float32 throughout.

    The group's query heads are summed first (the score is linear in the query), then one multiply-add per summary
    element and a row sum, so the summaries are read at memory speed (a ``tl.dot`` needs the query padded to 16
    columns: 16 times the multiply-adds).
    """
    pid_bh = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = (pid_bh // kv_heads).to(tl.int64)
    h = (pid_bh % kv_heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q_row = q_ptr + b * stride_qb + (h * GROUP) * stride_qh + offs_d * stride_qd
    grouped = tl.full([BLOCK_D], 0.0, tl.float32)
    for g in tl.static_range(GROUP):  # the GQA group's query heads, summed in float32
        grouped += tl.load(q_row + g * stride_qh, mask=mask_d, other=0.0).to(tl.float32)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < n_chunks
    s_ptrs = s_ptr + b * stride_sb + h * stride_sh + offs_c[:, None] * stride_sc + offs_d[None, :] * stride_sd
    s = tl.load(s_ptrs, mask=mask_c[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    scores = tl.reduce(s * grouped[None, :], 1, tl.standard._sum_combine)  # [BLOCK_C], row sums
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_c * stride_oc, scores, mask=mask_c)


def gather_kv_kernel(
    k_ptr, v_ptr, idx_ptr, out_k_ptr, out_v_ptr, kv_heads, n_slots, head_dim,
    stride_b, stride_h, stride_l, stride_d, stride_ib, stride_ih, stride_is, stride_ob, stride_oh, stride_os, stride_od,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program: KV head ``(b, h)``, view slots ``[pid_s * BLOCK_S, +BLOCK_S)``; keys and values."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // kv_heads).to(tl.int64)
    h = (pid_bh % kv_heads).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    mask_s = offs_s < n_slots
    offs_d = tl.arange(0, BLOCK_D)
    mask = mask_s[:, None] & (offs_d < head_dim)[None, :]
    tokens = tl.load(idx_ptr + b * stride_ib + h * stride_ih + offs_s * stride_is, mask=mask_s, other=0)
    src = b * stride_b + h * stride_h + tokens.to(tl.int64)[:, None] * stride_l + offs_d[None, :] * stride_d
    dst = b * stride_ob + h * stride_oh + offs_s.to(tl.int64)[:, None] * stride_os + offs_d[None, :] * stride_od
    tl.store(out_k_ptr + dst, tl.load(k_ptr + src, mask=mask), mask=mask)
    tl.store(out_v_ptr + dst, tl.load(v_ptr + src, mask=mask), mask=mask)


def score_chunk_keys_kernel(
    q_ptr, k_ptr, c_ptr, out_ptr, kv_heads, n_chosen, head_dim, group,
    stride_qb, stride_qh, stride_qd, stride_kb, stride_kh, stride_kl, stride_kd,
    stride_cb, stride_ch, stride_cf, stride_ob, stride_oh, stride_of,
    CHUNK: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program: KV head ``(b, h)``, chosen chunks ``[pid_f * BLOCK_F, +BLOCK_F)``; float32 throughout.

    Per chosen chunk, the largest logit over its ``CHUNK`` tokens and the group's query heads: the chunks' ``t``-th
    tokens read where they lie (no gather), a row sum per query head, an elementwise ``tl.maximum``.
    """
    pid_bh = tl.program_id(0)
    pid_f = tl.program_id(1)
    b = (pid_bh // kv_heads).to(tl.int64)
    h = (pid_bh % kv_heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q_row = q_ptr + b * stride_qb + (h * group) * stride_qh + offs_d * stride_qd
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = offs_f < n_chosen
    chunks = tl.load(c_ptr + b * stride_cb + h * stride_ch + offs_f * stride_cf, mask=mask_f, other=0).to(tl.int64)
    k_base = k_ptr + b * stride_kb + h * stride_kh + offs_d[None, :] * stride_kd
    mask_k = mask_f[:, None] & mask_d[None, :]
    best = tl.full([BLOCK_F], float("-inf"), tl.float32)
    for t in range(CHUNK):  # a loop, not unrolled: compiles several times faster
        k = tl.load(k_base + (chunks * CHUNK + t)[:, None] * stride_kl, mask=mask_k, other=0.0).to(tl.float32)
        for g in range(group):  # the group's query heads (a few rows, read from cache after the first token)
            q = tl.load(q_row + g * stride_qh, mask=mask_d, other=0.0).to(tl.float32)
            best = tl.maximum(best, tl.reduce(k * q[None, :], 1, tl.standard._sum_combine))  # [BLOCK_F]
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_f * stride_of, best, mask=mask_f)


_CHOSEN_COUNTS = ["n_chosen", "stride_cb", "stride_ch", "stride_ob", "stride_oh"]
"""Arguments that move with the context's length: not specialized, so the kernel does not recompile as it grows."""


@functools.cache
def compiled_kernels(interpret: bool) -> SimpleNamespace:
    """The kernels jitted for one mode (``interpret`` must equal ``triton.knobs.runtime.interpret`` now)."""
    del interpret  # the cache key: triton.jit reads the mode itself
    # counts and strides that grow with the context are not specialized on (each recompilation stalls a refresh)
    return SimpleNamespace(
        score=triton.jit(score_chunks_kernel, do_not_specialize=["n_chunks", "stride_ob", "stride_oh"]),
        gather=triton.jit(gather_kv_kernel, do_not_specialize=["n_slots"]),
        chunk_keys=triton.jit(score_chunk_keys_kernel, do_not_specialize=_CHOSEN_COUNTS),
    )
