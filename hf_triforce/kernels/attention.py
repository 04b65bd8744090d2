"""Grouped-query attention over a long cache without materializing repeated key/value heads.

transformers' ``sdpa`` copies keys and values to every query head (``repeat_kv``) whenever a mask is present (every
multi-token forward over a cache); the reference is its ``sdpa_attention_forward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import InvalidInputError


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` ``[B, H_q, q, D]`` over ``key``/``value`` ``[B, H_kv, L, D]``, GQA heads unexpanded.

    A transformers attention function (``dropout`` must be 0): returns ``([B, q, H_q, D_v], None)``.
    ``attention_mask``: boolean (True = attend) or additive ``[B, 1, q, L]``, or ``None`` (causal, bottom-right).

    Example:
        >>> q, k = torch.randn(1, 6, 3, 8), torch.randn(1, 2, 10, 8)
        >>> gqa_sdpa_attention(None, q, k, k, None)[0].shape
        torch.Size([1, 3, 6, 8])
    """
    if dropout:
        raise InvalidInputError("gqa_sdpa_attention is for inference: dropout must be 0.")
    q_len, kv_len = query.shape[2], key.shape[2]
    is_causal = attention_mask is None and 1 < q_len == kv_len
    if attention_mask is None and 1 < q_len < kv_len:
        attention_mask = _bottom_right_causal(q_len, kv_len, query.device)
    grouped = key.shape[1] != query.shape[1]
    if grouped and not is_causal and (attention_mask is None or attention_mask.shape[1] == 1):
        return _packed_gqa(query, key, value, attention_mask, scaling), None
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=is_causal, enable_gqa=grouped
    )
    return out.transpose(1, 2).contiguous(), None


def _packed_gqa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """SDPA with each KV head's query heads packed into ``groups * q`` rows, so each key is read once per KV head (not
    once per query head, as ``enable_gqa`` does on the CPU); ``mask`` ``[B or 1, 1 or H_kv, q or 1, L]``. Returns
    ``[B, q, H_q, D_v]``."""
    b, h_q, q_len, d = query.shape
    h_kv = key.shape[1]
    groups = h_q // h_kv
    packed = query.reshape(b, h_kv, groups * q_len, d)
    if mask is not None:
        mask = mask.expand(b, -1, q_len, -1)[:, :, None].expand(-1, -1, groups, -1, -1)
        mask = mask.reshape(b, mask.shape[1], groups * q_len, mask.shape[-1])
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h_q, q_len, value.shape[-1]).transpose(1, 2).contiguous()


def _bottom_right_causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """``[1, 1, q, kv_len]`` bool mask: query ``i`` sees keys ``0 .. kv_len - q + i``.

    Example:
        >>> _bottom_right_causal(2, 3, torch.device("cpu"))[0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return (torch.arange(kv_len, device=device)[None, :] <= rows)[None, None]


def packed_causal_bias(
    groups: int, q_len: int, kv_len: int, dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """``[groups * q, kv_len]`` additive bottom-right causal bias for a KV head's query group packed into rows: row
    ``r`` (query ``r % q``) sees keys ``0 .. kv_len - q + r % q``.

    Example:
        >>> packed_causal_bias(2, 2, 3, torch.float32).isfinite().int().tolist()
        [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]
    """
    query = torch.arange(groups * q_len, device=device) % q_len
    visible = torch.arange(kv_len, device=device)[None] <= (kv_len - q_len + query)[:, None]
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))


def slot_attention_mask(
    key_valid: torch.Tensor,
    q_len: int,
    in_window: torch.Tensor | None = None,
    query_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, 1 or H_kv, q, L]`` bool mask (``True``: attend) of ``q`` queries over a batch's key slots.

    Valid key slots (``key_valid`` ``[B, 1 or H_kv, L]``), causal, within ``in_window`` ``[B, 1, q, L]`` if given; a
    query always sees its own slot (``query_slots`` ``[q]``, default the last ``q_len``), so no row is fully masked.

    Example:
        >>> valid = torch.tensor([[[False, True, True, True]]])
        >>> slot_attention_mask(valid, 2)[0, 0].int().tolist()
        [[0, 1, 1, 0], [0, 1, 1, 1]]
        >>> slot_attention_mask(valid, 1, query_slots=torch.tensor([2]))[0, 0].int().tolist()
        [[0, 1, 1, 0]]
    """
    kv_len = key_valid.shape[-1]
    if query_slots is None:
        query_slots = torch.arange(kv_len - q_len, kv_len, device=key_valid.device)
    causal = torch.arange(kv_len, device=key_valid.device)[None, :] <= query_slots[:, None]
    mask = key_valid[:, :, None, :] & causal[None, None]
    if in_window is not None:
        mask = mask & in_window
    mask[..., torch.arange(q_len, device=key_valid.device), query_slots] = True
    return mask


def tree_attention_mask(rows: torch.Tensor, kv_len: int, window: int | None = None) -> torch.Tensor:
    """``[1, 1, q, kv_len]`` bool mask of a token tree's ``q`` nodes (their keys last of the tree's ``m``, last of all):
    every key before the tree, and the tree's keys where ``rows`` ``[q, m]`` (each node's ancestors and itself) says.

    With a sliding ``window`` the keys before the tree are the contiguous tokens just before its root, and a node at
    depth ``d`` (``rows[i].sum() - 1`` ancestors) sees those within ``window`` of its position (root + ``d``); when
    ``q == m`` (the whole tree) also only the ancestors within the window.

    Example:
        >>> rows = torch.tensor([[True, True, False], [True, False, True]])  # two siblings under one root
        >>> tree_attention_mask(rows, 5)[0, 0].int().tolist()
        [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
        >>> chain = torch.tensor([[True, False], [True, True]])  # a root and its child, window 3
        >>> tree_attention_mask(chain, 5, window=3)[0, 0].int().tolist()
        [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    """
    q, m = rows.shape
    before = torch.ones(q, kv_len - m, dtype=torch.bool, device=rows.device)
    tree = rows.bool()
    if window is not None:
        depths = tree.sum(dim=1, keepdim=True) - 1  # [q, 1]
        key = torch.arange(kv_len - m, device=rows.device)[None]
        before = key > (kv_len - m) + depths - window  # the root's position minus `before`'s length is key 0's
        if q == m:
            tree = tree & (depths - depths.T < window)
    return torch.cat([before, tree], dim=1)[None, None]


def masked_gqa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_valid: torch.Tensor,
    scaling: float | None = None,
    query_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """Attention of the last ``q`` slots over keys, skipping invalid key slots (padding, holes of a batch).

    ``query`` ``[B, H_q, q, D]``, ``key``/``value`` ``[B, H_kv, L, D or D_v]``; ``key_valid`` and ``query_slots`` as in
    :func:`slot_attention_mask`; heads packed as in :func:`_packed_gqa`. Returns ``([B, q, H_q, D_v], None)``.

    Example:
        >>> q, k = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 10, 8)
        >>> masked_gqa_attention(q, k, k, torch.ones(2, 1, 10, dtype=torch.bool))[0].shape
        torch.Size([2, 3, 6, 8])
    """
    mask = slot_attention_mask(key_valid, query.shape[2], query_slots=query_slots)
    return _packed_gqa(query, key, value, mask, scaling), None
