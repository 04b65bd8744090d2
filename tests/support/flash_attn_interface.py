"""A pure-torch stand-in for the ``flash_attn_interface`` package (FlashAttention 3's Python API).

transformers' ``flash_attention_3`` implementation imports ``flash_attn_func`` and
``flash_attn_varlen_func`` from this module name. The real package needs a Hopper GPU; this one
computes the same thing with ``scaled_dot_product_attention`` so that hf_triforce's caches can be
tested on the CPU under flash attention's contract: no mask tensor, ``causal=True`` aligned to the
bottom right (query ``i`` of ``Sq`` sees keys ``0 .. Sk - Sq + i``, flash-attn >= 2.1 semantics),
grouped-query heads unexpanded. Only the unpadded (non-varlen) entry point is implemented: a varlen
call means transformers found padding or packed sequences, which a TriForce forward must never produce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CALLS: list[tuple[int, int]] = []  # (query length, key length) of every call, for tests to inspect


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
) -> torch.Tensor:
    """``q`` ``[B, Sq, H, D]``, ``k``/``v`` ``[B, Sk, H_kv, D]`` -> ``[B, Sq, H, D]``."""
    if window_size != (-1, -1) or softcap:
        raise NotImplementedError("the stand-in implements neither sliding windows nor softcap")
    CALLS.append((q.shape[1], k.shape[1]))
    query, key, value = (x.transpose(1, 2) for x in (q, k, v))
    sq, sk = query.shape[2], key.shape[2]
    mask = None
    if causal and sq > 1:
        rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        mask = torch.arange(sk, device=q.device)[None, :] <= rows
    grouped = key.shape[1] != query.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=softmax_scale, enable_gqa=grouped)
    return out.transpose(1, 2)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, deterministic=False,
):  # fmt: skip
    """Signature only (transformers reads it to know which options the kernel takes)."""
    raise AssertionError("a padded/packed (varlen) flash call: TriForce forwards are unpadded, batch 1")


flash_attn_with_kvcache = None
