"""Retrieval kernels, chunk scoring and the gather into a sparse view: :func:`chunk_scores`, :func:`chunk_key_scores`
and :func:`gather_kv_into` run a Triton kernel (``*_triton``) where it is enabled, else their pure-torch reference."""

from __future__ import annotations

import torch

from ..errors import InvalidInputError
from .dispatch import check_device, interpreting, triton_enabled
from .guard import first_launch_guard

# --- the pure-torch references ---


def chunk_means(keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Mean key of each complete chunk (a partial last one left out): ``[B, H_kv, L, D]`` -> ``[B, H_kv, C, D]``.

    Example:
        >>> chunk_means(torch.ones(1, 2, 17, 4), 8).shape
        torch.Size([1, 2, 2, 4])
    """
    b, h, length, d = keys.shape
    n = length // chunk_size
    return keys[:, :, : n * chunk_size].reshape(b, h, n, chunk_size, d).mean(dim=3)


def score_chunks(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Score every chunk per KV head ``h``: ``sum_{g in group(h)} q_g . s_{h,c}`` over the query heads sharing ``h``.

    ``query`` ``[B, H_q, D]`` (post-RoPE; ``H_q / H_kv`` consecutive heads per group, as ``repeat_kv`` lays them out),
    ``summaries`` ``[B, H_kv, C, D]``; returns ``[B, H_kv, C]`` in ``summaries.dtype``.

    Example:
        >>> score_chunks(torch.ones(1, 4, 8), torch.ones(1, 2, 5, 8)).shape
        torch.Size([1, 2, 5])
    """
    b, hq, d = query.shape
    hkv = summaries.shape[1]
    grouped = query.reshape(b, hkv, hq // hkv, d).sum(dim=2)
    return torch.einsum("bhd,bhcd->bhc", grouped.to(summaries.dtype), summaries)


def score_chunk_keys(query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Score chunks ``chunks`` ``[B, H_kv, F]`` by their largest logit, ``max_{g in group(h), t in c} q_g . k_{h,t}``.

    ``query`` ``[B, H_q, D]`` and ``keys`` ``[B, H_kv, L, D]`` post-RoPE, each chunk complete; returns ``[B, H_kv, F]``
    float32 (unscaled logits; only the ranking is used). Reads every key of the chunks (a mean key blurs a token that
    stands out), so :func:`~hf_triforce.caches.selection.rescore` only re-ranks nominees with it.

    Example:
        >>> keys = torch.zeros(1, 1, 24, 2); keys[0, 0, 13] = torch.tensor([3.0, 0.0])
        >>> score_chunk_keys(torch.tensor([[[1.0, 0.0]]]), keys, torch.tensor([[[0, 1, 2]]]), 8).tolist()
        [[[0.0, 3.0, 0.0]]]
    """
    return score_all_chunk_keys(query, gather_chunks(keys, chunks, chunk_size).float(), chunk_size)


def gather_chunks(states: torch.Tensor, chunks: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The tokens of chunks ``chunks`` ``[B, H, F]`` of ``states`` ``[B, H, L, D]``, per head, as one new contiguous
    ``[B, H, F * chunk_size, D]`` tensor (chunk ``chunks[..., i]`` at tokens ``i * chunk_size ..``)."""
    b, h, f, d = states.shape[0], states.shape[1], chunks.shape[-1], states.shape[-1]
    n = states.shape[2] // chunk_size
    by_chunk = states[:, :, : n * chunk_size].unflatten(2, (n, chunk_size))  # [B, H, n, chunk_size, D], a view
    if states.device.type == "cpu" and states.stride(-1) == 1 and states.stride(-2) == d:
        # one index_select of whole chunks (rows of chunk_size * D) per (b, h): the CPU's fastest way
        out = states.new_empty(b, h, f, chunk_size * d)
        _rows_into(by_chunk.flatten(-2), chunks, out)  # a CPU tensor and a contiguous out: always taken
        return out.view(b, h, f * chunk_size, d)
    batch, head = torch.arange(b, device=chunks.device)[:, None, None], torch.arange(h, device=chunks.device)[:, None]
    return by_chunk[batch, head, chunks].reshape(b, h, f * chunk_size, d)


def score_all_chunk_keys(query: torch.Tensor, keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """:func:`score_chunk_keys` for every complete chunk of ``keys``, read in place (pure torch on every device).

    ``query`` ``[B, H_q, D]`` may hold several queries per query head, laid out by KV head group as ``repeat_kv`` does;
    returns ``[B, H_kv, L // chunk_size]`` float32, equal to :func:`score_chunk_keys` over all the chunks."""
    b, hq, d = query.shape
    hkv = keys.shape[1]
    n = keys.shape[2] // chunk_size
    grouped = query.reshape(b, hkv, hq // hkv, d).to(keys.dtype)
    logits = torch.matmul(grouped, keys[:, :, : n * chunk_size].transpose(-1, -2))  # [B, H_kv, G, n * chunk_size]
    return logits.amax(dim=2).view(b, hkv, n, chunk_size).amax(dim=-1).float()  # the max is exact in any dtype


def gather_tokens(states: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Gather ``[B, H, S, D]`` states at per-head token ``indices`` ``[B, H, S]`` from ``[B, H, L, D]``."""
    return states.gather(2, indices[..., None].expand(-1, -1, -1, states.shape[-1]))


# --- dispatch ---


def chunk_scores(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Chunk scores ``[B, H_kv, C]``: :func:`score_chunks_triton` on CUDA, else :func:`score_chunks` (same arguments).

    Float32 from Triton, ``summaries.dtype`` from the reference (only the ranking is used).

    Example:
        >>> chunk_scores(torch.ones(1, 4, 8), torch.ones(1, 2, 5, 8))[0, 0].tolist()
        [16.0, 16.0, 16.0, 16.0, 16.0]
    """
    if triton_enabled(query, summaries):
        return first_launch_guard("score_chunks", score_chunks_triton, score_chunks, query, summaries)
    return score_chunks(query, summaries)


def chunk_key_scores(query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Key scores ``[B, H_kv, F]`` of the chunks at ``chunks``: :func:`score_chunk_keys_triton` on CUDA, else
    :func:`score_chunk_keys` (same arguments and result, float32)."""
    if triton_enabled(query, keys, chunks):
        args = (query, keys, chunks, chunk_size)
        return first_launch_guard("score_chunk_keys", score_chunk_keys_triton, score_chunk_keys, *args)
    return score_chunk_keys(query, keys, chunks, chunk_size)


def gather_kv_into(
    keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, out_keys: torch.Tensor, out_values: torch.Tensor
) -> None:
    """Copy the keys and values ``[B, H_kv, L, D]`` at per-head token ``indices`` ``[B, H_kv, S]`` into ``out_keys`` and
    ``out_values`` ``[B, H_kv, S, D]``, in place; exact every way.

    :func:`gather_kv_triton` on CUDA; on the CPU one ``index_select`` of whole rows per batch row and KV head; else
    ``out.copy_(gather_tokens(states, indices))``. Any strides (e.g. slices of larger buffers).

    Example:
        >>> k, v = torch.arange(12.).view(1, 1, 6, 2), -torch.arange(12.).view(1, 1, 6, 2)
        >>> ok, ov = torch.empty(1, 1, 2, 2), torch.empty(1, 1, 2, 2)
        >>> gather_kv_into(k, v, torch.tensor([[[0, 5]]]), ok, ov)
        >>> ok[0, 0].tolist(), ov[0, 0, 1].tolist()
        ([[0.0, 1.0], [10.0, 11.0]], [-10.0, -11.0])
    """
    args = (keys, values, indices, out_keys, out_values)
    if triton_enabled(*args):
        first_launch_guard("gather_kv", gather_kv_triton, _gather, *args)
        return
    _gather(*args)


def _gather(keys, values, indices, out_keys, out_values) -> None:
    for states, out in ((keys, out_keys), (values, out_values)):
        if not _rows_into(states, indices, out):
            out.copy_(gather_tokens(states, indices))


def _rows_into(states: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> bool:
    """``out[b, h] = states[b, h, indices[b, h]]`` as one ``index_select`` per ``(b, h)`` (faster on the CPU than
    ``gather``); False, untouched, unless every ``out[b, h]`` is contiguous."""
    if states.device.type != "cpu" or not (out.stride(-1) == 1 and out.stride(-2) == out.shape[-1]):
        return False
    for b in range(indices.shape[0]):
        for h in range(indices.shape[1]):
            torch.index_select(states[b, h], 0, indices[b, h], out=out[b, h])
    return True


# --- the Triton entry points ---


def score_chunks_triton(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """:func:`score_chunks` in one Triton launch, float32 accumulation, float32 ``[B, H_kv, C]`` scores out.

    Float32 out whatever the input dtype: bfloat16 scores would make near-equal chunks tie in the top-k. Any strides;
    CUDA tensors, or CPU under ``TRITON_INTERPRET=1``.
    """
    b, hq, d = _check_score_inputs(query, summaries)
    hkv, n_chunks = summaries.shape[1], summaries.shape[2]
    out = torch.empty((b, hkv, n_chunks), dtype=torch.float32, device=summaries.device)
    if out.numel() == 0:
        return out
    block_c, grid, block_d = _tiles(b * hkv, n_chunks, d)
    _kernels().score[grid](
        query, summaries, out, hkv, n_chunks, d, *query.stride(), *summaries.stride(), *out.stride(),
        GROUP=hq // hkv, BLOCK_C=block_c, BLOCK_D=block_d,
    )  # fmt: skip
    return out


def score_chunk_keys_triton(
    query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """:func:`score_chunk_keys` in one Triton launch, float32 accumulation: the chosen chunks' keys read where they lie.

    Any strides; CUDA tensors, or CPU under ``TRITON_INTERPRET=1``. ``chunks`` are not bounds-checked.
    """
    b, group = _check_chunk_key_inputs(query, keys, chunks)
    hkv, n_chosen, d = keys.shape[1], chunks.shape[2], keys.shape[3]
    out = torch.empty((b, hkv, n_chosen), dtype=torch.float32, device=keys.device)
    if out.numel() == 0:
        return out
    block_f, grid, block_d = _tiles(b * hkv, n_chosen, d)
    _kernels().chunk_keys[grid](
        query, keys, chunks, out, hkv, n_chosen, d, group, *query.stride(), *keys.stride(), *chunks.stride(),
        *out.stride(), CHUNK=chunk_size, BLOCK_F=block_f, BLOCK_D=block_d,
    )  # fmt: skip
    return out


def gather_kv_triton(
    keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, out_keys: torch.Tensor, out_values: torch.Tensor
) -> None:
    """:func:`gather_kv_into` in one Triton launch: a bit-exact copy (no arithmetic on the states).

    ``indices`` (any integer dtype and strides) are not bounds-checked: they must lie in ``[0, L)``. ``values`` must
    have the dtype and strides of ``keys``, ``out_values`` those of ``out_keys``.
    """
    b, hkv, n_slots, d = _check_gather_inputs(keys, values, indices, out_keys, out_values)
    if b * hkv * n_slots * d == 0:
        return
    block_s, grid, block_d = _tiles(b * hkv, n_slots, d)
    _kernels().gather[grid](
        keys, values, indices, out_keys, out_values, hkv, n_slots, d, *keys.stride(), *indices.stride(),
        *out_keys.stride(), BLOCK_S=block_s, BLOCK_D=block_d,
    )  # fmt: skip


def _tiles(rows: int, length: int, head_dim: int) -> tuple[int, tuple[int, int], int]:
    """Block size along ``length`` (a power of two in [16, 64]), the ``(rows, blocks)`` launch grid, and the block of
    ``head_dim`` (the next power of two)."""
    import triton

    block = min(64, max(16, triton.next_power_of_2(length)))
    return block, (rows, triton.cdiv(length, block)), triton.next_power_of_2(head_dim)


def _kernels():
    from ._retrieval_triton import compiled_kernels

    return compiled_kernels(interpreting())


def _check_score_inputs(query: torch.Tensor, summaries: torch.Tensor) -> tuple[int, int, int]:
    if query.dim() != 3 or summaries.dim() != 4:
        shapes = f"{tuple(query.shape)}, {tuple(summaries.shape)}"
        raise InvalidInputError(f"expected query [B, H_q, D] and summaries [B, H_kv, C, D], got {shapes}.")
    b, hq, d = query.shape
    hkv = summaries.shape[1]
    if summaries.shape[0] != b or summaries.shape[3] != d or hkv == 0 or hq % hkv:
        raise InvalidInputError(f"incompatible query {tuple(query.shape)} and summaries {tuple(summaries.shape)}.")
    check_device("score_chunks_triton", query, summaries)
    return b, hq, d


def _check_chunk_key_inputs(query: torch.Tensor, keys: torch.Tensor, chunks: torch.Tensor) -> tuple[int, int]:
    if query.dim() != 3 or keys.dim() != 4 or chunks.dim() != 3:
        shapes = f"{tuple(query.shape)}, {tuple(keys.shape)}, {tuple(chunks.shape)}"
        raise InvalidInputError(
            f"expected query [B, H_q, D], keys [B, H_kv, L, D] and chunks [B, H_kv, F], got {shapes}."
        )
    b, hq, d = query.shape
    hkv = keys.shape[1]
    if keys.shape[0] != b or keys.shape[3] != d or not 0 < hkv <= hq or hq % hkv or chunks.shape[:2] != (b, hkv):
        shapes = f"{tuple(query.shape)}, {tuple(keys.shape)}, {tuple(chunks.shape)}"
        raise InvalidInputError(f"incompatible query, keys and chunks: {shapes}.")
    if chunks.dtype.is_floating_point or chunks.dtype == torch.bool:
        raise InvalidInputError(f"chunks must be integer chunk ids, got {chunks.dtype}.")
    check_device("score_chunk_keys_triton", query, keys, chunks)
    return b, hq // hkv


def _check_gather_inputs(keys, values, indices, out_keys, out_values) -> tuple[int, int, int, int]:
    if keys.dim() != 4 or indices.dim() != 3:
        raise InvalidInputError(f"expected keys [B, H, L, D] and indices [B, H, S], got {keys.shape}, {indices.shape}.")
    b, hkv, _, d = keys.shape
    n_slots = indices.shape[2]
    if values.shape != keys.shape or values.stride() != keys.stride() or values.dtype != keys.dtype:
        raise InvalidInputError("values must have the shape, strides and dtype of keys.")
    if tuple(indices.shape[:2]) != (b, hkv) or indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise InvalidInputError(
            f"indices must be integer [B, H, S] = [{b}, {hkv}, S], got {indices.dtype} {indices.shape}."
        )
    expected = (b, hkv, n_slots, d)
    for name, out in (("out_keys", out_keys), ("out_values", out_values)):
        if tuple(out.shape) != expected or out.dtype != keys.dtype:
            raise InvalidInputError(f"{name} must be {keys.dtype} {expected}, got {out.dtype} {tuple(out.shape)}.")
    if out_values.stride() != out_keys.stride():
        raise InvalidInputError("out_values must have the strides of out_keys.")
    check_device("gather_kv_triton", keys, values, indices, out_keys, out_values)
    return b, hkv, n_slots, d
