"""Level-1 logits of many positions at once: one forward over a shared sparse view with a per-row mask.

The positions measured between two re-selections all see the same selected tokens plus the tokens
cached since the selection, up to their own position. One forward feeds their input tokens as a
``B``-token sequence over ``cat(selected tokens, tokens cached since)`` with a 4D additive mask in which
row ``i`` sees the selection, the tokens cached before its own position, and itself (not the other
rows). Every layer is row-wise apart from attention, so row ``i`` computes exactly what a one-token
forward over a :class:`~hf_triforce.caches.RetrievalView` holding those tokens computes (the tests check
this), while the weights are read once for ``B`` positions.

Example:
    >>> logits = view_logits(model, cache, selection, selected_at=4000, lengths=torch.tensor([4000, 4001]),
    ...                      input_ids=torch.tensor([11, 12]))  # doctest: +SKIP
    >>> logits.shape  # doctest: +SKIP
    torch.Size([2, 49152])
"""

from __future__ import annotations

import torch
from transformers import Cache, CacheLayerMixin

from ...caches.retrieval import RetrievalCache
from ...hf.linears import small_batch_linears
from ...hf.model import vocab_size
from ...hf.versions import cache_kwargs
from ...kernels.linear import MAX_ROWS
from ...kernels.retrieval import gather_tokens

DEFAULT_MAX_ROWS = MAX_ROWS  # rows per forward: the CPU few-row linear path covers up to this many


class SharedViewLayer(CacheLayerMixin):
    """Fixed ``[1, H_kv, S, D]`` view keys/values; a forward's new states are appended to a copy."""

    is_sliding = False
    is_croppable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2] + query_length, 0

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        return -1


class SharedViewCache(Cache):
    """A sparse view shared by the rows of one forward (used with an explicit 4D attention mask)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        super().__init__(layers=[SharedViewLayer(k, v) for k, v in zip(keys, values, strict=True)])


def view_logits(
    model,
    cache: RetrievalCache,
    selection: list[torch.Tensor],
    selected_at: int,
    lengths: torch.Tensor,
    input_ids: torch.Tensor,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> torch.Tensor:
    """Next-token logits ``[B, V]`` of ``B`` one-token level-1 forwards sharing one selection.

    Row ``i`` feeds ``input_ids[i]`` at position ``lengths[i]`` over the view of ``lengths[i]`` cached
    tokens: ``selection`` (chosen when ``selected_at`` tokens were cached) plus cached tokens
    ``[selected_at, lengths[i])`` with their exact full-cache keys and values.

    Args:
        model: the target model (its attention must take a 4D additive mask: sdpa or eager).
        cache: the full cache (holding at least ``max(lengths)`` tokens).
        selection: per-layer ``[1, H_kv, S]`` token indices (the same ``S`` in every layer).
        selected_at: cached tokens at selection time (every index in ``selection`` is below it).
        lengths: ``[B]`` cached tokens visible to each row, each ``>= selected_at``.
        input_ids: ``[B]`` the token each row feeds.
        max_rows: rows per forward.

    Returns:
        float32 ``[B, V]`` raw logits.

    Example:
        >>> view_logits(model, cache, sel, 100, torch.tensor([100]), torch.tensor([5])).shape  # doctest: +SKIP
        torch.Size([1, 49152])
    """
    sizes = {idx.shape[-1] for idx in selection}
    if len(sizes) != 1 or int(lengths.min()) < selected_at:
        raise ValueError("view_logits needs one selection size in every layer and lengths >= selected_at.")
    out = []
    with torch.inference_mode(), small_batch_linears(model):
        for start in range(0, lengths.shape[0], max_rows):
            rows = slice(start, start + max_rows)
            out.append(_forward(model, cache, selection, selected_at, lengths[rows], input_ids[rows]))
    if not out:
        return torch.empty(0, vocab_size(model))
    return torch.cat(out)


def _forward(model, cache: RetrievalCache, selection, selected_at: int, lengths, input_ids) -> torch.Tensor:
    end = int(lengths.max())
    keys, values = [], []
    for layer, idx in zip(cache.layers, selection, strict=True):
        k, v = layer.buffer.keys, layer.buffer.values
        keys.append(torch.cat([gather_tokens(k, idx), k[:, :, selected_at:end]], dim=-2))
        values.append(torch.cat([gather_tokens(v, idx), v[:, :, selected_at:end]], dim=-2))
    visible = selection[0].shape[-1] + (lengths - selected_at)
    mask = row_mask(visible, keys[0].shape[-2], keys[0].dtype)
    out = model(
        input_ids=input_ids[None],
        position_ids=lengths[None],
        **cache_kwargs(SharedViewCache(keys, values)),
        attention_mask=mask,
        use_cache=True,
    )
    return out.logits[0].float()


def row_mask(visible: torch.Tensor, shared: int, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, B, shared + B]`` additive mask: row ``i`` sees ``visible[i]`` shared keys and its own new key.

    Example:
        >>> (row_mask(torch.tensor([1, 2]), 2, torch.float32)[0, 0] == 0).int().tolist()
        [[1, 0, 1, 0], [1, 1, 0, 1]]
    """
    rows = visible.shape[0]
    columns = torch.arange(shared + rows)
    sees = (columns[None] < visible[:, None]) | (columns[None] == shared + torch.arange(rows)[:, None])
    mask = torch.zeros(rows, shared + rows, dtype=dtype)
    return mask.masked_fill(~sees, torch.finfo(dtype).min)[None, None]
