"""The verification's attention on the CPU with the keys split into ranges that run as one fused-SDPA call.

CPU SDPA shares its work among threads by batch row, KV head and block of query rows. A verification of a few tokens
over a long cache, with each KV head's query group packed into its rows, is one block per KV head: with 3 KV heads
on 2 threads one thread sits idle a third of the time. Here the keys are split into ``parts`` ranges that are the
batch rows of one call (views of the cache, no copy) and the ranges' outputs merged by their log-sum-exp: SmolLM2's 30
layers, 7 tokens over 7,067 keys, 2 threads: 62 -> 53 ms of attention a verification. The reference is
:func:`~hf_triforce.kernels.verification.verify_attention_reference`.
"""

from __future__ import annotations

import functools
import math

import torch

from .attention import packed_causal_bias

MIN_PART_KEYS = 512
"""Keys per range at least: shorter ranges cost their calls' overhead more than an idle thread costs."""


def cpu_key_parts(batch_heads: int, kv_len: int, threads: int | None = None) -> int:
    """Key ranges that give each of ``threads`` (default: torch's) as many of the call's ``batch_heads`` x ranges
    work items as the others, at least :data:`MIN_PART_KEYS` keys each.

    Example:
        >>> cpu_key_parts(3, 7067, threads=2), cpu_key_parts(8, 7067, threads=2), cpu_key_parts(3, 700, threads=2)
        (2, 1, 1)
    """
    threads = threads or torch.get_num_threads()
    parts = threads // math.gcd(batch_heads, threads)
    return max(1, min(parts, kv_len // MIN_PART_KEYS))


@functools.cache
def cpu_kernel_available() -> bool:
    """Whether this torch has CPU SDPA with its log-sum-exp (``_scaled_dot_product_flash_attention_for_cpu``)."""
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def verify_attention_cpu(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None, parts: int | None = None
) -> torch.Tensor | None:
    """Bottom-right causal attention of ``q`` new tokens over ``L`` cached keys on the CPU, GQA heads unexpanded,
    the keys in ``parts`` ranges (default :func:`cpu_key_parts`); ``None`` where one range would do or the layout is
    not one it takes (batch 1, each head's keys and values rows of ``D`` contiguous values).

    ``query`` ``[1, H_q, q, D]``, ``key``/``value`` ``[1, H_kv, L, D]`` (the queries' own keys last). Returns
    ``[1, H_q, q, D]`` in ``query.dtype``.

    Example:
        >>> q, k = torch.randn(1, 6, 3, 16), torch.randn(1, 2, 1100, 16)
        >>> verify_attention_cpu(q, k, k, parts=2).shape
        torch.Size([1, 6, 3, 16])
    """
    b, h_q, q_len, d = query.shape
    h_kv, kv_len = key.shape[1], key.shape[2]
    parts = parts or cpu_key_parts(h_kv, kv_len)
    if parts < 2 or b != 1 or not cpu_kernel_available() or not _rows_contiguous(key, value):
        return None
    stride = kv_len // parts  # range i covers keys [i * stride, i * stride + span): the last ends at L
    span = kv_len - stride * (parts - 1)
    if stride < q_len:
        return None
    groups = h_q // h_kv
    packed = query.reshape(1, h_kv, groups * q_len, d).expand(parts, -1, -1, -1)
    keys, values = (_ranges(t, parts, stride, span) for t in (key, value))
    mask = _range_mask(parts, stride, span, groups, q_len, query.dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        packed, keys, values, attn_mask=mask, scale=scale
    )[:2]  # [parts, H_kv, rows, D], [parts, H_kv, rows]
    weight = torch.softmax(lse.float(), dim=0)[..., None]
    merged = (out.float() * weight).sum(0)  # [H_kv, groups * q, D]
    return merged.view(1, h_q, q_len, d).to(query.dtype)


def _rows_contiguous(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in tensors)


def _ranges(t: torch.Tensor, parts: int, stride: int, span: int) -> torch.Tensor:
    """``[parts, H, span, D]`` views of ``t`` ``[1, H, L, D]``: range ``i`` starts at key ``i * stride``."""
    h, d = t.shape[1], t.shape[3]
    return t.as_strided((parts, h, span, d), (stride * d, t.stride(1), d, 1), t.storage_offset())


@functools.lru_cache(maxsize=8)
def _range_mask(parts: int, stride: int, span: int, groups: int, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """``[parts, 1, groups * q, span]`` additive mask: each range but the last hides its last ``span - stride`` keys
    (the next range's first), the last is bottom-right causal (packed row ``r`` is query ``r % q``). Made once per
    shape: a verification's layers share it."""
    mask = torch.zeros(parts, 1, groups * q_len, span, dtype=dtype)
    mask[:-1, :, :, stride:] = float("-inf")
    mask[-1, 0] = packed_causal_bias(groups, q_len, span, dtype)
    return mask
