"""Attention of a few new tokens over a long cache (the full-cache verification): :func:`verify_attention_triton` is
flash-decoding with the GQA group folded into the query rows; on the CPU
:func:`~hf_triforce.kernels.verify_cpu.verify_attention_cpu` runs ranges of the keys as one SDPA call;
:func:`verify_attention_reference` is pure torch."""

from __future__ import annotations

import torch

from ..errors import InvalidInputError
from .attention import gqa_sdpa_attention
from .dispatch import check_device, interpreting, triton_enabled
from .guard import first_launch_guard
from .verify_cpu import verify_attention_cpu

BLOCK_N = 64  # keys per tile
MAX_ROWS = 64  # query tokens x GQA group the kernel takes (one tile of rows, in registers)


def verify_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Bottom-right causal attention of ``q`` new tokens over ``L`` cached keys, GQA heads unexpanded.

    ``query`` ``[B, H_q, q, D]`` (post-RoPE), ``key``/``value`` ``[B, H_kv, L, D]`` (``L >= q``, the queries' own keys
    last). Returns ``[B, H_q, q, D]`` in ``query.dtype``.

    Example:
        >>> q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 40, 16)
        >>> verify_attention(q, k, k).shape
        torch.Size([1, 4, 3, 16])
    """
    args = (query, key, value, scale)
    if triton_enabled(query, key, value):
        return first_launch_guard("verify_attention", verify_attention_triton, verify_attention_reference, *args)
    if query.device.type == "cpu":
        out = verify_attention_cpu(*args)
        if out is not None:
            return out
    return verify_attention_reference(*args)


def verify_attention_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """The pure-torch reference of :func:`verify_attention`: grouped SDPA, bottom-right causal."""
    return gqa_sdpa_attention(None, query, key, value, None, scaling=scale)[0].transpose(1, 2)


def verify_attention_triton(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None, splits: int | None = None
) -> torch.Tensor:
    """:func:`verify_attention` as one split-KV Triton launch and a log-sum-exp merge.

    ``splits`` key ranges (default: about two programs per multiprocessor) over all ``L`` keys. CUDA tensors, or CPU
    under ``TRITON_INTERPRET=1``.
    """
    import triton

    b, hq, q_len, d = _check_inputs(query, key, value)
    hkv, kv_len = key.shape[1], key.shape[2]
    group = hq // hkv
    block_m, block_d = max(16, triton.next_power_of_2(group * q_len)), max(16, triton.next_power_of_2(d))
    split_len = BLOCK_N * triton.cdiv(triton.cdiv(kv_len, splits or _default_splits(b * hkv, kv_len, key)), BLOCK_N)
    n_splits = triton.cdiv(kv_len, split_len)
    acc = torch.empty(b, hkv, n_splits, block_m, d, dtype=torch.float32, device=query.device)
    m, s = (torch.empty(b, hkv, n_splits, block_m, dtype=torch.float32, device=query.device) for _ in range(2))
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    _launch()[(b * hkv, n_splits)](
        query, key, value, acc, m, s, hkv, q_len, kv_len, d, split_len, scale or d**-0.5,
        *query.stride(), *key.stride(), *value.stride(), *acc.stride()[:4], *m.stride()[:3],
        GROUP=group, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=block_d, PRECISION=precision,
    )  # fmt: skip
    return merge_splits(acc, m, s, group, q_len).to(query.dtype)


def merge_splits(acc: torch.Tensor, m: torch.Tensor, s: torch.Tensor, group: int, q_len: int) -> torch.Tensor:
    """Merge per-split ``acc`` ``[B, H_kv, S, M, D]``, max ``m``, sum ``s`` ``[B, H_kv, S, M]`` (rows ``g * q_len + i``)
    into ``[B, H_kv * group, q_len, D]`` float32."""
    rows = group * q_len
    acc, m, s = acc[..., :rows, :], m[..., :rows], s[..., :rows]
    weight = torch.exp(m - m.amax(2, keepdim=True))  # splits that saw no key have m = -inf: weight 0
    out = (acc * weight[..., None]).sum(2) / (s * weight).sum(2)[..., None]
    b, hkv, _, d = out.shape
    return out.view(b, hkv, group, q_len, d).reshape(b, hkv * group, q_len, d)


def _default_splits(programs: int, kv_len: int, like: torch.Tensor) -> int:
    """About two programs per multiprocessor, at least ``BLOCK_N`` keys each."""
    sms = torch.cuda.get_device_properties(like.device).multi_processor_count if like.is_cuda else 4
    return max(1, min(-(-kv_len // BLOCK_N), -(-2 * sms // programs)))


def _check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[int, int, int, int]:
    if query.dim() == 4 and key.dim() == 4 and query.shape[1] * query.shape[2] > MAX_ROWS * key.shape[1]:
        raise InvalidInputError(
            f"verify_attention_triton takes at most {MAX_ROWS} query rows per KV head (tokens x group)."
        )
    if query.dim() != 4 or key.shape != value.shape or key.dim() != 4:
        raise InvalidInputError(
            f"expected query [B, H_q, q, D], key = value [B, H_kv, L, D]; got {query.shape}, {key.shape}."
        )
    b, hq, q_len, d = query.shape
    if key.shape[0] != b or key.shape[3] != d or hq % key.shape[1] or not 0 < q_len <= key.shape[2]:
        raise InvalidInputError(f"incompatible query {tuple(query.shape)} and key {tuple(key.shape)}.")
    check_device("verify_attention_triton", query, key, value)
    return b, hq, q_len, d


def _launch():
    from ._verify_triton import launcher

    return launcher(interpreting())
